package queue_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Extreme values in every column certworker owns, as a hand edit or a bug may leave
// them: places at both ends of bigint and of smallint, a hold naming nothing, infinite
// times, a lease that never ends, junk in the claim and CA columns. Then the proxy's
// inserts, verifies, updates and deletes all commit, and the worker serves every row:
// each one in line is claimed, the one in 'provisioning' with an endless lease is
// reclaimed, and no pass fails. Guards against the wake trigger's and ReturnHeld's
// "+ 1" on ssl_queue_seq (22003 inside the proxy's own verify), against 'infinity'
// in a time the passes subtract or scan (an error on every pass, for ever), and
// against a lease that is never reclaimed.
func TestExtremeValues_InCertworkersColumnsBreakNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	odd := map[string]string{
		"top place":          `ssl_queue_seq = 9223372036854775807`,
		"bottom place":       `ssl_queue_seq = -9223372036854775808`,
		"top tier":           `ssl_queue_tier = 32767`,
		"bottom tier":        `ssl_queue_tier = -32768`,
		"held for nothing":   `ssl_held = 'nothing:at all'`,
		"queued at infinity": `ssl_queued_at = 'infinity', ssl_claim_prev_attempt_at = 'infinity'`,
		"queued at -inf":     `ssl_queued_at = '-infinity', ssl_claim_prev_attempt_at = '-infinity'`,
		"renew by infinity":  `ssl_renew_by = 'infinity', ssl_queue_tier = 3`,
		"renew by -infinity": `ssl_renew_by = '-infinity', ssl_queue_tier = 1`,
		"junk claim and CA": `ssl_claim_token = gen_random_uuid(), ssl_claimed_by = repeat('x', 10000),
			ssl_lease_expires_at = '-infinity', ssl_ca_directory = repeat('y', 10000), ssl_ca_cause = 'junk',
			ssl_ca_refused = 'https://nowhere.invalid/', ssl_profile_refused = repeat('z', 10000)`,
		"eligible at -inf": `ssl_eligible_at = '-infinity'`,
	}
	ids := map[string]string{}
	for what, set := range odd {
		id := b.named(t, tn, strings.ReplaceAll(what, " ", "-")+".extreme.example")
		ids[what] = id
		b.exec(t, `UPDATE proxy_domains SET `+set+` WHERE id = $1`, id)
	}
	stuck := b.named(t, tn, "stuck.extreme.example")
	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'provisioning', ssl_claim_token = gen_random_uuid(),
		ssl_claimed_by = 'gone', ssl_last_attempt_at = now(), ssl_lease_expires_at = 'infinity' WHERE id = $1`, stuck)

	// The proxy's writes, each in a transaction of its own, all commit.
	pending := b.unverified(t, tn, "verify-me.extreme.example")
	for i, stmt := range []string{
		fmt.Sprintf(`INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
			VALUES ('%s', 'inserted.extreme.example', 'verified', 'tok', 'pending', 'acme')`, tn),
		fmt.Sprintf(`UPDATE proxy_domains SET verification_status = 'verified' WHERE id = '%s'`, pending),
		fmt.Sprintf(`UPDATE proxy_domains SET ssl_provider = 'manual' WHERE id = '%s'`, ids["eligible at -inf"]),
		fmt.Sprintf(`UPDATE proxy_domains SET ssl_provider = 'acme' WHERE id = '%s'`, ids["eligible at -inf"]),
		fmt.Sprintf(`UPDATE proxy_domains SET ssl_status = 'failed' WHERE id = '%s'`, ids["top tier"]),
		fmt.Sprintf(`UPDATE proxy_domains SET ssl_status = 'pending', ssl_attempts = 0 WHERE id = '%s'`, ids["top tier"]),
		`DELETE FROM proxy_domains WHERE domain = 'inserted.extreme.example'`,
	} {
		_, err := b.pool.Exec(b.ctx, stmt)
		require.NoError(t, err, "the proxy's write %d failed: %s", i, stmt)
	}

	// The worker's passes.
	_, _, err := b.q.NextDue(b.ctx, testDirectory)
	require.NoError(t, err)
	_, err = b.q.NextMaintenance(b.ctx)
	require.NoError(t, err)
	_, err = b.q.State(b.ctx, "stuck.extreme.example")
	require.NoError(t, err, "status DOMAIN of a row with an endless lease")
	_, err = b.q.Overview(b.ctx)
	require.NoError(t, err)
	reclaimed, err := b.q.ReclaimAbandoned(b.ctx)
	require.NoError(t, err)
	require.Len(t, reclaimed, 1, "a lease that never ends was not reclaimed")
	require.Equal(t, stuck, reclaimed[0].ID)
	_, _, err = b.q.MarkCaseDuplicates(b.ctx)
	require.NoError(t, err)
	_, err = b.q.MarkRenewals(b.ctx)
	require.NoError(t, err)

	claimed := map[string]bool{}
	for _, id := range b.drain(t) {
		claimed[id] = true
	}
	for what, id := range ids {
		require.True(t, claimed[id], "the row with %s was never claimed", what)
	}
	require.True(t, claimed[pending], "the domain verified beside the odd rows was never claimed")
	require.True(t, claimed[stuck], "the reclaimed row was never claimed")
	var places int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains WHERE ssl_queue_seq IS NOT NULL`).Scan(&places))
	require.Positive(t, places)
}
