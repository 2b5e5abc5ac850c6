package queue_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The proxy's retry forgets every CA's recorded refusal of the name, as `certworker
// retry` does: a tenant who changed the CAA records that caused it
// and pressed retry had the domain fail again 0.1 s later, with nothing sent, because
// ssl_ca_refused outlived certworker_queue_for_issuance.
func TestQueueForIssuance_ForgetsEveryCAsRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id, _ := b.domain(t, tn, "failed", 3, ago(60))
	b.exec(t, `UPDATE proxy_domains SET ssl_ca_refused = 'https://first.invalid/dir', ssl_ca_refused_cause = 'caa'
WHERE id = $1`, id)
	ok, err := b.q.QueueForIssuance(b.ctx, id, tn)
	require.NoError(t, err)
	require.True(t, ok)
	var refused, cause *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ssl_ca_refused, ssl_ca_refused_cause FROM proxy_domains WHERE id = $1`, id).Scan(&refused, &cause))
	require.Nil(t, refused, "the refusal outlived the proxy's retry")
	require.Nil(t, cause)
	require.Equal(t, "pending", b.status(t, id))
}

// A profile set by a plain UPDATE of ssl_profile (not certworker_set_profile) on an
// active domain whose certificate was issued under another profile puts it back in
// the queue at once, with its history cleared, and wakes the workers: the wake
// trigger, which fires after the profile's trigger, sees the row enter the claimable
// set. Only the housekeeping, every 10 minutes, acted on it, and the certificate was
// not replaced within 60 s. Rows the rule leaves alone stay active. A write of the
// profile forgets a refused one (certworker_profile_set), so a profile written back
// to the refused one is queued, as certworker_set_profile queues it.
func TestProfileTrigger_APlainUpdateOfTheProfileQueuesTheReplacement(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, certProfile, refused, newProfile string
		autoRenew, queued                      bool
	}{
		{"another profile", "classic", "", "shortlived", true, true},
		{"the certificate's own profile", "classic", "", "classic", true, false},
		{"a certificate with no recorded profile", "", "", "shortlived", true, false},
		{"the profile the CA refused, which the write forgets", "classic", "shortlived", "shortlived", true, true},
		{"auto_renew off", "classic", "", "shortlived", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			name := "profile.example"
			id := b.namedIn(t, b.tenant(t), name, "active", 3)
			b.exec(t, `UPDATE proxy_domains SET ssl_last_attempt_at = now() - interval '1 day',
    ssl_profile_refused = NULLIF($2, '') WHERE id = $1`, id, tc.refused)
			b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, profile, auto_renew)
VALUES ($1, 'pem', 'key', NULLIF($2, ''), $3)`, name, tc.certProfile, tc.autoRenew)
			n := b.notifications(t, func() {
				b.exec(t, `UPDATE proxy_domains SET ssl_profile = $2 WHERE id = $1`, id, tc.newProfile)
			})
			r := b.sslRow(t, id)
			if !tc.queued {
				require.Equal(t, "active", r.Status)
				require.Zero(t, n)
				return
			}
			require.Equal(t, "pending", r.Status)
			require.Zero(t, r.Attempts)
			require.Nil(t, r.LastAttempt)
			require.Equal(t, 1, n, fmt.Sprint("wake-ups: ", n))
		})
	}
}
