package queue_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The progress of a mass replacement: the certificates whose renewal window has
// started and are still stored count, those whose window has not started (or whose
// replacement was stored) do not; the pace is the renewals the ledger saw issued in
// the last quarter hour; done-by is now plus the backlog at that pace, and is "never"
// (nil, +Inf for the alert) without a recent replacement.
func TestReplaceProgress_CountsStartedWindowsAndTheirPace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	cert := func(name, windowStart, expires string) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, ari_window_start, ari_window_end)
VALUES ($1, 'pem', 'key', now() + $3::interval, now() + $2::interval, now() + $2::interval + interval '1 hour')`,
			name, windowStart, expires)
		require.NoError(t, err)
	}
	var names []string
	for range 4 {
		_, n := b.domain(t, tn, "active", 0, ago(60))
		names = append(names, n)
	}
	cert(names[0], "-1 minute", "10 days")
	cert(names[1], "-2 days", "3 days")  // the first to expire
	cert(names[2], "-1 hour", "-1 hour") // expired: nothing left to replace
	cert(names[3], "+1 day", "60 days")  // its window has not started

	p, err := b.q.ReplaceProgress(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Equal(t, 2, p.Due)
	require.NotNil(t, p.EarliestExpiry)
	require.WithinDuration(t, p.At.Add(3*24*time.Hour), *p.EarliestExpiry, time.Minute)
	require.Zero(t, p.Replaced)
	require.Nil(t, p.DoneBy, "no replacement lately: never, at this pace")
	require.True(t, p.Late())

	// Four renewals issued in the last quarter hour (and one older, one a first
	// issuance, one another CA's): two left take 7.5 minutes at that pace.
	_, err = b.pool.Exec(b.ctx, `
INSERT INTO certworker_ledger (directory, name, registered_domain, renewal, outcome, at)
SELECT d, 'n', 'n', r, 'issued', now() - a::interval
FROM (VALUES ($1, true, '1 minute'), ($1, true, '2 minutes'), ($1, true, '3 minutes'), ($1, true, '14 minutes'),
             ($1, true, '20 minutes'), ($1, false, '1 minute'), ('https://other.invalid/dir', true, '1 minute')) v(d, r, a)`,
		testDirectory)
	require.NoError(t, err)
	p, err = b.q.ReplaceProgress(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Equal(t, 4, p.Replaced)
	require.NotNil(t, p.DoneBy)
	require.WithinDuration(t, p.At.Add(issuing.ReplacePaceWindow/2), *p.DoneBy, time.Second)
	require.False(t, p.Late())

	// Replaced: the new certificate's window has not started.
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_certificates SET ari_window_start = now() + interval '50 days' WHERE domain = ANY($1)`,
		names[:2])
	require.NoError(t, err)
	p, err = b.q.ReplaceProgress(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Zero(t, p.Due)
	require.Nil(t, p.EarliestExpiry)
	require.Equal(t, p.At, *p.DoneBy)
}
