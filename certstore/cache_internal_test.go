package certstore

import (
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Loads of one name can finish out of order (a notification forgets the load under
// way and starts another). The outcome must be the newest read: the one that began
// after more notifications, or between two that began together the higher version.
// Guards against a slow load putting back a certificate a renewal replaced, or a
// miss read before a certificate was stored hiding it.
func TestCache_NewestReadWins(t *testing.T) {
	t.Parallel()
	now := time.Now()
	old := &entry{cert: &tls.Certificate{}, notAfter: now.Add(time.Hour), version: 5, freshUntil: now.Add(time.Hour)}
	renewed := &entry{cert: &tls.Certificate{}, notAfter: now.Add(time.Hour), version: 7, freshUntil: now.Add(time.Hour)}
	missing := &entry{miss: errors.New("no certificate"), freshUntil: now.Add(time.Hour)}
	at := func(e *entry, from uint64) *entry { cp := *e; cp.from = from; return &cp }

	for _, tc := range []struct {
		name        string
		first, then *entry
		want        *entry
	}{
		{"slow load that began earlier is dropped", at(renewed, 3), at(old, 2), renewed},
		{"load that began later replaces", at(old, 2), at(renewed, 3), renewed},
		{"same epoch: higher version wins", at(renewed, 3), at(old, 3), renewed},
		{"same epoch: higher version wins the other way", at(old, 3), at(renewed, 3), renewed},
		{"a miss read earlier does not hide a certificate", at(renewed, 3), at(missing, 2), renewed},
		{"a miss read later (deleted) replaces", at(renewed, 2), at(missing, 3), missing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCache(10)
			c.epoch = 3
			c.apply("a.example", tc.first)
			got := c.apply("a.example", tc.then)
			require.Same(t, got, c.lookup("a.example"))
			require.Equal(t, tc.want.version, got.version)
			require.Equal(t, tc.want.miss, got.miss)
		})
	}
}

// A notification during a load makes its result outdated, so the next handshake
// reads again; a placeholder keeps the mark for a name loaded for the first time.
// Guards against a miss read just before the worker's commit being remembered for
// MissTTL while the certificate sits in the database.
func TestCache_NotificationDuringALoadOutdatesItsResult(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newCache(10)
	from, cur := c.begin("new.example")
	require.Nil(t, cur)
	require.True(t, c.notify("new.example"), "the placeholder takes the notification")
	got := c.apply("new.example", &entry{miss: errors.New("no certificate"), from: from, freshUntil: now.Add(time.Hour)})
	require.True(t, got.outdated())
	require.False(t, got.current(now))

	from, _ = c.begin("new.example")
	got = c.apply("new.example", &entry{cert: &tls.Certificate{}, notAfter: now.Add(time.Hour), version: 1, from: from, freshUntil: now.Add(time.Hour)})
	require.True(t, got.current(now))
	require.False(t, c.notify("never-asked.example"), "a name never asked for is not remembered")
}
