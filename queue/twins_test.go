package queue_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
)

// twinRow is what a twin test looks at.
func (b *bundle) twinRow(t *testing.T, id string) (status string, sslError *string) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status, ssl_error FROM proxy_domains WHERE id = $1`, id).
		Scan(&status, &sslError))
	return status, sslError
}

// requireAnonymous: a twin's ssl_error never identifies the row that keeps the name:
// not its id, its spelling, or its tenant.
func requireAnonymous(t *testing.T, sslError *string, keeperID, keeperName, keeperTenant string) {
	t.Helper()
	require.NotNil(t, sslError)
	require.True(t, strings.HasPrefix(*sslError, "duplicate domain: "), *sslError)
	for _, s := range []string{keeperID, keeperName, keeperTenant} {
		require.NotContains(t, *sslError, s, "a twin's ssl_error identifies the row that keeps the name")
	}
}

// Tenant B adds A's verified name in another case, unverified and with ssl_provider
// 'none'. Only verified acme rows count, so A is claimed, and neither housekeeping nor
// the claim touches either row: anyone may add a row, and none may hold A's back.
func TestTwins_AnUnverifiedOrNonACMETwinNeverHoldsBackAVerifiedRow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, verification, provider string }{
		{"unverified, none", "pending", "none"},
		{"verified, manual", "verified", "manual"},
		{"unverified, acme", "pending", "acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a, other := b.tenant(t), b.tenant(t)
			victim := b.named(t, a, "victim.example")
			_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
VALUES ($1, 'VICTIM.EXAMPLE', $2, 'tok', 'pending', $3)`, other, tc.verification, tc.provider)
			require.NoError(t, err)

			marked, back, err := b.q.MarkCaseDuplicates(b.ctx)
			require.NoError(t, err)
			require.Empty(t, marked, "housekeeping failed a row for a twin that does not count")
			require.Empty(t, back)
			b.claimOne(t, victim)
			status, sslError := b.twinRow(t, victim)
			require.Equal(t, "provisioning", status)
			require.Nil(t, sslError)
		})
	}
}

// Of two verified acme twins, neither holding a certificate, the one that became
// verified and acme first keeps the name, whatever the order of their inserts: it is
// claimed, and the claim itself fails the other with words that do not identify the
// keeper. Guards against a rule by created_at or ssl_queued_at (stamped again by every
// failure), and against a claim that skips the loser without saying why.
func TestTwins_TheTwinVerifiedFirstKeepsTheNameAndTheClaimFailsTheOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, other := b.tenant(t), b.tenant(t)
	late := b.unverified(t, other, "Shop.Example") // inserted first, verified last
	first := b.named(t, a, "shop.example")
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE id = $1`, late)
	require.NoError(t, err)

	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, first, claims[0].ID)
	status, sslError := b.twinRow(t, late)
	require.Equal(t, "failed", status, "the claim left the twin that lost the name")
	requireAnonymous(t, sslError, first, "shop.example", a)
}

// A verified twin added beside an active domain that holds the name's certificate
// loses, even though it was verified while the keeper's certificate was being
// renewed; housekeeping, which reads the rows the claim does not, never fails the
// keeper.
func TestTwins_TheRowHoldingTheCertificateKeepsTheName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, other := b.tenant(t), b.tenant(t)
	keeper := b.namedIn(t, a, "served.example", "active", 0)
	b.putCert(t, "served.example", "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n", nil)
	// The twin's eligibility is older than the keeper's: only the certificate decides.
	twin := b.namedIn(t, other, "SERVED.example", "active", 0)
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE proxy_domains DISABLE TRIGGER certworker_eligible_since;
UPDATE proxy_domains SET ssl_eligible_at = now() - interval '1 year' WHERE domain = 'SERVED.example';
ALTER TABLE proxy_domains ENABLE TRIGGER certworker_eligible_since`)
	require.NoError(t, err)

	marked, _, err := b.q.MarkCaseDuplicates(b.ctx)
	require.NoError(t, err)
	require.Len(t, marked, 1)
	require.Equal(t, twin, marked[0].ID)
	requireAnonymous(t, &marked[0].Reason, keeper, "served.example", a)
	status, _ := b.twinRow(t, keeper)
	require.Equal(t, "active", status, "housekeeping failed the row holding the name's certificate")
	status, _ = b.twinRow(t, twin)
	require.Equal(t, "failed", status)
}

// A row failed as a duplicate whose twin no longer counts, or has gone, keeps its name
// now: housekeeping puts it back in the queue, and it is claimed.
func TestTwins_ARowFailedAsADuplicateGetsItsNameBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, other := b.tenant(t), b.tenant(t)
	victim := b.namedIn(t, a, "back.example", "failed", 3)
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_error = 'duplicate domain: BACK.EXAMPLE (x) has the same name in another case; neither is ordered until one is deleted' WHERE id = $1`, victim)
	require.NoError(t, err)
	b.unverified(t, other, "BACK.EXAMPLE")

	marked, back, err := b.q.MarkCaseDuplicates(b.ctx)
	require.NoError(t, err)
	require.Empty(t, marked)
	require.Len(t, back, 1)
	require.Equal(t, victim, back[0].ID)
	b.claimOne(t, victim)
}

// status DOMAIN and retry pass over twins that do not count: the name, typed in any
// case, is the verified acme row's, so another tenant's unverified row cannot block an
// operator's retry.
func TestTwins_RetryAndStatePassOverATwinThatDoesNotCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, other := b.tenant(t), b.tenant(t)
	victim := b.namedIn(t, a, "ops.example", "failed", 10)
	b.unverified(t, other, "OPS.example")

	s, err := b.q.State(b.ctx, "Ops.Example")
	require.NoError(t, err)
	require.Equal(t, victim, s.ID)
	require.NoError(t, b.q.Retry(b.ctx, "Ops.Example"))
	b.claimOne(t, victim)
}

// The rule's SQL is usable on its own, as the documentation gives it to the proxy.
func TestTwins_KeepsNameSQLNamesOneKeeper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for _, n := range []string{"one.example", "One.example", "ONE.example"} {
		b.named(t, tn, n)
	}
	var keepers int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM proxy_domains d
WHERE lower(d.domain) = 'one.example' AND `+queue.KeepsNameSQL("d")).Scan(&keepers))
	require.Equal(t, 1, keepers)
}

// The housekeeping's search for case twins reads the names of the verified acme rows
// from proxy_domains_twins_idx alone (an index-only scan in name order), and the rows
// only of the names held twice: never a scan of the table or a probe per row, nor an
// index the planner cannot read lower(domain) from (without the name included it
// visits every row). Sequential and bitmap scans are off so that a table this small
// still shows which index plans are possible.
func TestTwins_TheSearchReadsTheNamesFromTheIndexAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider)
SELECT $1, 'twin' || g || '.example', 'verified', 'tok', 'active', 'acme' FROM generate_series(1, 500) g`, tenant)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `VACUUM ANALYZE proxy_domains`)
	require.NoError(t, err)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // read only
	_, err = tx.Exec(b.ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off`)
	require.NoError(t, err)
	rows, err := tx.Query(b.ctx, `EXPLAIN `+queue.TwinCandidatesSQLForTest)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "Index Only Scan using proxy_domains_twins_idx", plan)
	require.NotContains(t, plan, "Seq Scan on proxy_domains", plan)
	require.NotContains(t, plan, "SubPlan", "a probe per row:\n"+plan)
}
