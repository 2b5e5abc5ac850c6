package acme

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// An order's transport sends nothing once the claim's lease deadline has passed, not
// even a request it could answer from the session, and a request in flight when it
// passes ends then, without counting as the CA unreachable (which would pause the CA
// for every instance). Guards against the order of an instance cut off from its
// database, or paused, going on to finalize after another instance may have
// reclaimed the domain (issue #17).
func TestOrderTransport_SendsNothingPastTheLeaseDeadline(t *testing.T) {
	t.Parallel()
	var received atomic.Int32
	release := make(chan struct{})
	ca := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		if r.URL.Path == "/held" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(ca.Close)
	t.Cleanup(func() { close(release) })
	const lease = time.Second
	client := func(d *issuing.Deadline) (*http.Client, *orderTransport) {
		tr := &orderTransport{base: http.DefaultTransport, ctx: context.Background(), session: newSession(ca.URL + "/dir"), deadline: d}
		return &http.Client{Transport: tr, Timeout: time.Minute}, tr
	}

	passed, _ := client(issuing.NewDeadline(time.Now().Add(-lease), lease))
	_, err := passed.Post(ca.URL+"/finalize", "application/jose+json", nil)
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline)
	require.Zero(t, received.Load(), "a request went out past the deadline")

	d := issuing.NewDeadline(time.Now(), lease)
	inFlight, tr := client(d)
	start := time.Now()
	resp, err := inFlight.Post(ca.URL+"/held", "application/jose+json", nil)
	if resp != nil {
		resp.Body.Close()
	}
	require.Error(t, err, "the held request was not cut off at the deadline")
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline, "cut off by something else than the deadline")
	require.False(t, time.Now().Before(d.At()), "cut off %s before the deadline", time.Until(d.At()))
	require.Less(t, time.Since(start), 30*time.Second, "not cut off at the deadline but by the client's timeout")
	require.Equal(t, int32(1), received.Load())
	require.NoError(t, tr.unreachable(), "the deadline was recorded as the CA unreachable")

	_, err = inFlight.Get(ca.URL + "/dir")
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline)
	require.Equal(t, int32(1), received.Load())
}

// An order does not finalize once renewals of its lease are failing (less than a
// third of the lease left): a finalize makes the CA issue, and an order stopped
// between the finalize and the download leaves an issued certificate nobody stores,
// while the domain is ordered again.
func TestFinalizeAllowed_NotWithLessThanAThirdOfTheLeaseLeft(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	require.NoError(t, finalizeAllowed(context.Background(), nil, nil))
	require.NoError(t, finalizeAllowed(context.Background(), issuing.NewDeadline(time.Now(), lease), nil), "a freshly renewed lease")
	// The last renewal two thirds of a lease ago: one renewal missed.
	late := issuing.NewDeadline(time.Now().Add(-2*lease/3), lease)
	require.ErrorIs(t, finalizeAllowed(context.Background(), late, nil), issuing.ErrLeaseDeadline)
	require.ErrorIs(t, finalizeAllowed(context.Background(), issuing.NewDeadline(time.Now().Add(-lease), lease), nil), issuing.ErrLeaseDeadline)
}

// The finalize is gated by the worker's confirmation of the claim on the database
// first (issuing.Request.ConfirmClaim): a claim a failover lost leaves the local
// deadline untouched, and only the database can say it is gone. Its refusal is
// returned as it is, so that the worker tells a lost claim from a lease it could not
// renew; and a confirmation that succeeds still leaves the local rule to apply.
func TestFinalizeAllowed_AsksTheDatabaseFirst(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	asked := 0
	lost := func(context.Context) error { asked++; return issuing.ErrClaimLost }
	require.ErrorIs(t, finalizeAllowed(context.Background(), issuing.NewDeadline(time.Now(), lease), lost), issuing.ErrClaimLost)
	require.Equal(t, 1, asked)
	held := func(context.Context) error { asked++; return nil }
	require.NoError(t, finalizeAllowed(context.Background(), issuing.NewDeadline(time.Now(), lease), held))
	late := issuing.NewDeadline(time.Now().Add(-2*lease/3), lease)
	require.ErrorIs(t, finalizeAllowed(context.Background(), late, held), issuing.ErrLeaseDeadline)
	require.Equal(t, 3, asked)
}

// HTTP-01 token writes are fenced by the claim (issue #17). A CA reuses a pending
// authorization for the same account and name, so the order of an instance that was
// cut off past its lease, and the order of the instance that reclaimed the domain,
// answer the same challenge token. The stale order's late Present must not overwrite
// the live order's row, and its clean-up must not delete it: the CA would fail the
// live order's validation. Unfenced, both did.
func TestTokenStore_AStaleOrderNeitherOverwritesNorDeletesTheLiveOrdersToken(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	q := queue.New(pool, issuing.Config{Lease: time.Minute})
	const name, token = "fence.example", "shared-token"
	id := pgtest.Domain(t, pool, pgtest.Tenant(t, pool), name)
	claim := func() issuing.Claim {
		t.Helper()
		claims, err := q.Claim(ctx, "test", "https://ca.invalid/directory", 1)
		require.NoError(t, err)
		require.Len(t, claims, 1)
		return claims[0]
	}
	row := func() (keyAuth string, claimToken *string, err error) {
		err = pool.QueryRow(ctx, `SELECT key_authorization, claim_token::text FROM certworker_http01_tokens WHERE token = $1`,
			token).Scan(&keyAuth, &claimToken)
		return keyAuth, claimToken, err
	}
	store := func(c issuing.Claim) *tokenStore {
		return &tokenStore{pool: pool, log: zap.NewNop(), ctx: ctx, claim: c.Token}
	}

	stale := claim()
	require.NoError(t, store(stale).Present(name, token, token+".stale"), "a held claim stores its token")
	// Its instance is cut off; the lease runs out, another instance reclaims the
	// domain and claims it, and the CA hands its order the same authorization.
	_, err := pool.Exec(ctx, `UPDATE proxy_domains SET ssl_lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
	reclaimed, err := q.ReclaimAbandoned(ctx)
	require.NoError(t, err)
	require.Len(t, reclaimed, 1)
	live := claim()
	require.NoError(t, store(live).Present(name, token, token+".live"))

	err = store(stale).Present(name, token, token+".stale")
	require.ErrorIs(t, err, issuing.ErrLeaseDeadline, "a claim no longer held stored its token")
	require.NoError(t, store(stale).CleanUp(name, token, ""))
	keyAuth, owner, err := row()
	require.NoError(t, err, "the stale order's clean-up deleted the live order's token")
	require.Equal(t, token+".live", keyAuth)
	require.NotNil(t, owner)
	require.Equal(t, live.Token, *owner)

	require.NoError(t, store(live).CleanUp(name, token, ""))
	_, _, err = row()
	require.True(t, errors.Is(err, pgx.ErrNoRows), "the live order could not clean up its own token: %v", err)
}
