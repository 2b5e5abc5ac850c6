package queue_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// A rate-limit pause is shared by every instance and only ever grows: an instance
// that hit the limit later, with a shorter Retry-After, must not reopen what the
// first one paused before its pause ends, or the instances take turns hitting the
// limit.
func TestPause_ALaterShorterPauseDoesNotShortenIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p, err := b.q.CAPause(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Nil(t, p, "a CA never paused reads as paused")

	left, err := b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, time.Hour, "first")
	require.NoError(t, err)
	require.InDelta(t, time.Hour.Seconds(), left.Seconds(), 1)
	left, err = b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, time.Minute, "second, shorter")
	require.NoError(t, err)
	require.InDelta(t, time.Hour.Seconds(), left.Seconds(), 1, "a shorter pause shortened a longer one")
	p, err = b.q.CAPause(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Equal(t, "first", p.Reason, "the reason of the longer pause is kept")

	left, err = b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, 2*time.Hour, "third, longer")
	require.NoError(t, err)
	require.InDelta(t, (2 * time.Hour).Seconds(), left.Seconds(), 1, "a longer pause did not extend")

	p, err = b.q.CAPause(b.ctx, "https://other.test/directory")
	require.NoError(t, err)
	require.Nil(t, p, "another directory was paused")
}

// A pause that has run out holds nothing back: the worker must not wait for a time
// in the past, or treat the CA as paused for ever.
func TestPause_AnExpiredPauseHoldsNothingBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t), "pending", 0, nil)
	_, err := b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, 0, "over")
	require.NoError(t, err)
	p, err := b.q.CAPause(b.ctx, testDirectory)
	require.NoError(t, err)
	require.Nil(t, p)
	require.True(t, b.claimsInclude(t, id))
}

// Each scope holds back exactly what the CA's limit covers: the
// whole CA; every name under one registered domain and nothing else; one name and
// not its subdomains. A held-back domain is not claimed at all, so there is nothing
// to hand back and no wake-up storm, and it is claimed once the pause ends.
func TestClaim_SkipsWhatAPauseCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		scope, key    string
		held, notHeld []string
	}{
		{"the CA", issuing.ScopeCA, testDirectory,
			[]string{"a.shop.example", "other.example"}, nil},
		{"a registered domain", issuing.ScopeRegisteredDomain, "shop.example",
			[]string{"shop.example", "a.shop.example", "x.y.shop.example"},
			[]string{"myshop.example", "shop.example.net", "other.example"}},
		{"a registered domain under a multi-label suffix", issuing.ScopeRegisteredDomain, "shop.co.uk",
			[]string{"www.shop.co.uk"}, []string{"www.other.co.uk"}},
		{"one name", issuing.ScopeDomain, "a.shop.example",
			[]string{"A.Shop.Example"}, []string{"b.a.shop.example", "shop.example", "b.shop.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tn := b.tenant(t)
			ids := map[string]string{}
			for _, n := range append(append([]string{}, tc.held...), tc.notHeld...) {
				ids[n] = b.named(t, tn, n)
			}
			_, err := b.q.Pause(b.ctx, tc.scope, tc.key, issuing.PauseRateLimit, time.Hour, "test")
			require.NoError(t, err)
			claimed := b.drain(t)
			for _, n := range tc.held {
				require.NotContains(t, claimed, ids[n], "%s was claimed while paused", n)
			}
			for _, n := range tc.notHeld {
				require.Contains(t, claimed, ids[n], "%s was held back by a pause that does not cover it", n)
			}
			_, err = b.pool.Exec(b.ctx, `UPDATE certworker_pauses SET paused_until = now() - interval '1 second'`)
			require.NoError(t, err)
			claimed = b.drain(t)
			for _, n := range tc.held {
				require.Contains(t, claimed, ids[n], "%s was not claimed once the pause ended", n)
			}
		})
	}
}

// An unreachable CA is paused on its own backoff, doubling with each consecutive
// failure up to the cap, and the state ends when an order gets an answer.
func TestPauseUnreachable_BacksOffAndClears(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The pause as written: its end and the write's time, both the statement's now().
	// (For is what is left of it when the statement returns: a statement slow on a
	// loaded machine leaves less, so it is held to the length, not rounded to it.)
	pause := func() (until, written time.Time) {
		t.Helper()
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT paused_until, updated_at FROM certworker_pauses
WHERE scope = 'ca' AND key = $1 AND source = 'unreachable'`, testDirectory).Scan(&until, &written))
		return until, written
	}
	var got []time.Duration
	for i := 1; i <= 6; i++ {
		_, err := b.pool.Exec(b.ctx, `UPDATE certworker_pauses SET paused_until = now()`)
		require.NoError(t, err)
		u, err := b.q.PauseUnreachable(b.ctx, testDirectory, "connection refused", 2*time.Second, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, i, u.Failures)
		until, written := pause()
		require.Positive(t, u.For)
		require.LessOrEqual(t, u.For, until.Sub(written), "what is left of the pause")
		got = append(got, until.Sub(written))
	}
	require.Equal(t, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		30 * time.Second, 30 * time.Second}, got)
	// More orders failing while that pause is in force are the same try of the CA.
	before, _ := pause()
	u, err := b.q.PauseUnreachable(b.ctx, testDirectory, "connection refused", 2*time.Second, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, 6, u.Failures, "an order failing inside the pause made the backoff grow")
	after, _ := pause()
	require.Equal(t, before, after, "an order failing inside the pause moved its end")
	cleared, err := b.q.ClearUnreachable(b.ctx, testDirectory)
	require.NoError(t, err)
	require.True(t, cleared)
	u, err = b.q.PauseUnreachable(b.ctx, testDirectory, "connection refused", 2*time.Second, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, u.Failures, "the backoff did not start again after the CA answered")
}
