package acme_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// An order names the profile it is asked for (Request.Profile, else --acme-profile),
// and the certificate says which profile the CA issued it under; with --acme-profile
// empty the order names none, and the certificate still records the CA's choice.
// Guards against a domain's profile being dropped on the way to the CA, and against a
// certificate stored without the profile that decides whether it is replaced.
func TestIssue_NamesTheRequestedProfileAndRecordsIt(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{AllowUnnamedProfile: true}, true)
	ctx := testCtx(t, time.Minute)
	iss := newIssuer(t, b.pool, nil, b.config())

	own, err := iss.Issue(ctx, issuing.Request{Domain: randomName("own"), Profile: pebbletest.AltProfile})
	require.NoError(t, err)
	require.Equal(t, pebbletest.AltProfile, own.Profile)
	fleet, err := iss.Issue(ctx, issuing.Request{Domain: randomName("fleet")})
	require.NoError(t, err)
	require.Equal(t, pebbletest.DefaultProfile, fleet.Profile)

	cfg := b.config()
	cfg.Profile = ""
	caDefault, err := newIssuer(t, b.pool, nil, cfg).Issue(ctx, issuing.Request{Domain: randomName("none")})
	require.NoError(t, err)
	require.Contains(t, []string{pebbletest.DefaultProfile, pebbletest.AltProfile}, caDefault.Profile,
		"the CA's choice is recorded")

	orders := b.ca.Orders()
	require.Len(t, orders, 3)
	require.Equal(t, pebbletest.AltProfile, orders[0].Profile)
	require.Equal(t, pebbletest.DefaultProfile, orders[1].Profile)
	require.Empty(t, orders[2].Profile, "an empty --acme-profile names no profile")
}

// A profile the CA's directory does not list is refused before anything is sent, with
// what the CA offers; one it lists but refuses (invalidProfile) comes back the same
// way, with the CA's detail, and a renewal is not ordered a second time without
// "replaces" for it. Guards against an order the CA must refuse, a refusal charged
// as the domain's failure, and two refused orders for one.
func TestIssue_AProfileTheCADoesNotOfferIsProfileError(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	ctx := testCtx(t, time.Minute)

	_, err := newIssuer(t, b.pool, nil, b.config()).Issue(ctx, issuing.Request{Domain: randomName("bogus"), Profile: "bogus"})
	var pe *issuing.ProfileError
	require.ErrorAs(t, err, &pe, "%T: %v", err, err)
	require.Equal(t, "bogus", pe.Profile)
	require.Equal(t, []string{pebbletest.AltProfile, pebbletest.DefaultProfile}, pe.Offered)
	require.Empty(t, pe.Detail)
	require.Equal(t, `the CA does not offer profile "bogus"; it offers alternate, default`, err.Error())
	require.Zero(t, b.ca.OrderRequests(), "nothing is sent for a profile the directory does not list")
	require.Zero(t, b.ca.NewAccounts())

	name := randomName("refused")
	iss := newIssuer(t, b.pool, nil, b.config())
	current, err := iss.Issue(ctx, issuing.Request{Domain: name})
	require.NoError(t, err)
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Answer: pebbletest.InvalidProfile(pebbletest.AltProfile)})
	_, err = newIssuer(t, b.pool, nil, frontConfig(b, front)).Issue(ctx,
		issuing.Request{Domain: name, Profile: pebbletest.AltProfile, CurrentPEM: current.ChainPEM})
	require.ErrorAs(t, err, &pe, "%T: %v", err, err)
	require.Equal(t, pebbletest.AltProfile, pe.Profile)
	require.Equal(t, `profile name "alternate" not recognized`, pe.Detail)
	require.Equal(t, []string{pebbletest.AltProfile, pebbletest.DefaultProfile}, pe.Offered)
	require.Equal(t, 1, front.Answered()[pebbletest.StepNewOrder], "the refused renewal is not ordered again without replaces")
}

// Profiles lists what the CA's directory offers, sorted: run checks --acme-profile
// against it at start.
func TestProfiles_ListsTheDirectorysProfiles(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{ShortLifetime: time.Hour}, false)
	offered, err := newIssuer(t, b.pool, nil, b.config()).Profiles(testCtx(t, 30*time.Second))
	require.NoError(t, err)
	require.Equal(t, []string{pebbletest.AltProfile, pebbletest.DefaultProfile, pebbletest.ShortProfile}, offered)
}
