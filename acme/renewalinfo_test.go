package acme_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// The issued certificate carries the CA's renewal window and when to ask the CA
// again, and RenewalInfo, asked later for the stored chain, follows the CA when it
// moves the window earlier (as before a revocation): the worker renews then, not at
// the time chosen at issuance. Pebble's window is RFC 9773's, with Retry-After six
// hours. Guards against a window the CA moved that nobody asks about, and against
// a renewal-information schedule lost at issuance.
func TestRenewalInfo_FollowsTheCAsWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	iss := newIssuer(t, b.pool, nil, b.config())
	ctx := testCtx(t, 30*time.Second)
	cert, err := iss.Issue(ctx, issuing.Request{Domain: randomName("i")})
	require.NoError(t, err)

	// Pebble's window: two days around the point a third of the lifetime before
	// expiry.
	lifetime := cert.NotAfter.Sub(cert.NotBefore)
	ideal := cert.NotAfter.Add(-lifetime / 3)
	require.WithinDuration(t, ideal.Add(24*time.Hour), cert.WindowEnd, time.Minute)
	require.False(t, cert.RenewAt.Before(ideal.Add(-24*time.Hour).Add(-time.Minute)), "RenewAt %s", cert.RenewAt)
	require.True(t, cert.RenewAt.Before(cert.WindowEnd), "RenewAt %s", cert.RenewAt)
	requireJittered(t, 6*time.Hour, cert.RenewalInfoIn, "Pebble's Retry-After")

	w, err := iss.RenewalInfo(ctx, cert.ChainPEM)
	require.NoError(t, err)
	require.WithinDuration(t, cert.WindowEnd, w.End, time.Second)
	require.Equal(t, 6*time.Hour, w.RetryAfter)

	// The CA moves the window to now.
	start, end := time.Now().Add(-time.Minute).Truncate(time.Second), time.Now().Add(time.Hour).Truncate(time.Second)
	require.NoError(t, b.ca.SetRenewalWindow(parseChain(t, cert.ChainPEM)[0].SerialNumber, start, end))
	w, err = iss.RenewalInfo(ctx, cert.ChainPEM)
	require.NoError(t, err)
	require.True(t, w.Start.Equal(start), "start %s, want %s", w.Start, start)
	require.True(t, w.End.Equal(end), "end %s, want %s", w.End, end)
}

// The worker reads renewal information for many certificates at once. The CA's
// directory is fetched once for all of them, including the first reads of a fresh
// issuer, which run together: each fetched it before, 8 directory requests for 8
// reads. Guards against a fleet's renewal-information reads doubling the requests
// the CA sees.
func TestRenewalInfo_ConcurrentReadsFetchTheDirectoryOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	ctx := testCtx(t, 30*time.Second)
	cert, err := newIssuer(t, b.pool, nil, b.config()).Issue(ctx, issuing.Request{Domain: randomName("i")})
	require.NoError(t, err)

	iss := newIssuer(t, b.pool, nil, b.config())
	before := b.ca.Requests()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := iss.RenewalInfo(ctx, cert.ChainPEM)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	after := b.ca.Requests()
	require.Equal(t, 1, after[pebbletest.StepDirectory]-before[pebbletest.StepDirectory], "directory requests")
	require.Equal(t, 8, after[pebbletest.StepRenewalInfo]-before[pebbletest.StepRenewalInfo], "renewal-information requests")

	for range 3 {
		_, err := iss.RenewalInfo(ctx, cert.ChainPEM)
		require.NoError(t, err)
	}
	require.Equal(t, 1, b.ca.Requests()[pebbletest.StepDirectory]-before[pebbletest.StepDirectory], "the directory was fetched again")
}

// The read of renewal information right after an issuance takes a token of the
// fleet's budget (--ari-requests-per-second) like the worker's reads: at 0.01 a
// second the first issuance reads, the second finds the budget spent, sends the CA
// no question, renews by the lifetime for now, and leaves the read to the worker,
// due at once. Guards against issuances going around the budget the fleet shares.
func TestIssue_TheReadAfterIssuanceTakesATokenOfTheFleetsBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	cfg := b.config()
	cfg.RenewalInfoPerSecond = 0.01
	iss := newIssuer(t, b.pool, nil, cfg)
	ctx := testCtx(t, 30*time.Second)
	asked := func() int { return b.ca.Requests()[pebbletest.StepRenewalInfo] }

	first, err := iss.Issue(ctx, issuing.Request{Domain: randomName("budget")})
	require.NoError(t, err)
	require.Equal(t, 1, asked())
	require.False(t, first.WindowEnd.IsZero(), "the first issuance read the CA's window")
	requireJittered(t, 6*time.Hour, first.RenewalInfoIn, "Pebble's Retry-After")

	second, err := iss.Issue(ctx, issuing.Request{Domain: randomName("budget")})
	require.NoError(t, err)
	require.Equal(t, 1, asked(), "a read without a token")
	require.True(t, second.WindowEnd.IsZero())
	require.Equal(t, issuing.RenewalInfoSoon, second.RenewalInfoIn, "the worker reads it as soon as the budget allows")
	require.Equal(t, issuing.RenewAtFromValidity(second.NotBefore, second.NotAfter), second.RenewAt)
}

// RenewalInfo says ErrNoRenewalInfo for a CA that offers none (the worker stops
// asking), *issuing.CAUnavailableError for a CA that cannot be reached (the worker
// asks again later), and an error for a certificate the CA does not know. An
// issuance from such a CA has no window and no time to ask again. Guards against a
// worker asking a CA without ARI for ever, or giving up on ARI over one outage.
func TestRenewalInfo_CAWithoutARIOrUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	ctx := testCtx(t, 30*time.Second)
	cert, err := newIssuer(t, b.pool, nil, b.config()).Issue(ctx, issuing.Request{Domain: randomName("i")})
	require.NoError(t, err)

	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepDirectory, Answer: directoryWithout(t, b, "renewalInfo")})
	noARI := newIssuer(t, b.pool, nil, frontConfig(b, front))
	_, err = noARI.RenewalInfo(ctx, cert.ChainPEM)
	require.ErrorIs(t, err, issuing.ErrNoRenewalInfo)
	plain, err := noARI.Issue(ctx, issuing.Request{Domain: randomName("i")})
	require.NoError(t, err)
	require.True(t, plain.WindowEnd.IsZero(), "no window from a CA without ARI")
	require.Zero(t, plain.RenewalInfoIn, "nothing to ask a CA without ARI")
	require.Equal(t, issuing.RenewAtFromValidity(plain.NotBefore, plain.NotAfter), plain.RenewAt)

	down := pebbletest.NewFront(t, b.ca)
	iss := newIssuer(t, b.pool, nil, frontConfig(b, down))
	_, err = iss.RenewalInfo(ctx, cert.ChainPEM)
	require.NoError(t, err)
	down.SetDown(true)
	_, err = iss.RenewalInfo(ctx, cert.ChainPEM)
	var ue *issuing.CAUnavailableError
	require.ErrorAs(t, err, &ue, "%T: %v", err, err)

	other := pebbletest.StartT(t, pebbletest.Options{})
	otherCfg := b.config()
	otherCfg.DirectoryURL, otherCfg.CABundle = other.DirectoryURL, other.RootsFile
	_, err = newIssuer(t, b.pool, nil, otherCfg).RenewalInfo(ctx, cert.ChainPEM)
	require.Error(t, err)
	require.False(t, errors.Is(err, issuing.ErrNoRenewalInfo) || errors.As(err, &ue), "%T: %v", err, err)
}

// directoryWithout is an answer with the CA's directory minus one of its fields.
func directoryWithout(t *testing.T, b *bed, field string) pebbletest.Answer {
	t.Helper()
	resp, err := b.caClient(t).Get(b.ca.DirectoryURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var dir map[string]any
	require.NoError(t, json.Unmarshal(raw, &dir))
	delete(dir, field)
	out, err := json.Marshal(dir)
	require.NoError(t, err)
	return pebbletest.Answer{Status: http.StatusOK, ContentType: "application/json", Body: string(out)}
}

// A renewal window that starts inside the certificate's last tenth (Let's Encrypt's
// 5 to 3 days before the expiry of a 90-day certificate, as before a revocation)
// renews at the window's start, and the order succeeds. Guards against the panic
// (rand.Int64N of a negative span) that failed, and charged, an order whose
// certificate the CA had already issued.
func TestIssue_RenewalWindowInTheLastTenthRenewsAtItsStart(t *testing.T) {
	t.Parallel()
	day := 24 * time.Hour
	b := setup(t, pebbletest.Options{DefaultLifetime: 90 * day}, true)
	start := time.Now().Add(85 * day).Truncate(time.Second).UTC()
	end := start.Add(2 * day)
	window, err := json.Marshal(map[string]any{"suggestedWindow": map[string]string{
		"start": start.Format(time.RFC3339), "end": end.Format(time.RFC3339),
	}})
	require.NoError(t, err)
	front := pebbletest.NewFront(t, b.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepRenewalInfo, Answer: pebbletest.Answer{
		Status: http.StatusOK, ContentType: "application/json", Body: string(window), RetryAfter: time.Hour,
	}})

	cert, err := newIssuer(t, b.pool, nil, frontConfig(b, front)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("t")})
	require.NoError(t, err)
	require.InDelta(t, (90 * day).Hours(), cert.NotAfter.Sub(cert.NotBefore).Hours(), 1)
	require.True(t, cert.RenewAt.Equal(start), "RenewAt %s, want the window's start %s", cert.RenewAt, start)
	require.True(t, cert.WindowEnd.Equal(end), "WindowEnd %s, want %s", cert.WindowEnd, end)
	requireJittered(t, time.Hour, cert.RenewalInfoIn, "the CA's Retry-After")
}

// requireJittered checks that the time to ask the CA again is its Retry-After, spread
// over a tenth of it (issuing.RenewalInfoIn).
func requireJittered(t *testing.T, retryAfter, got time.Duration, what string) {
	t.Helper()
	require.GreaterOrEqual(t, got, retryAfter, what)
	require.LessOrEqual(t, got, retryAfter+retryAfter/10, what)
}
