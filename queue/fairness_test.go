package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// bulk inserts n domains for tenant and verifies them in one statement, as a tenant's
// import does; it returns their names.
func (b *bundle) bulk(t *testing.T, tenant, prefix string, n int) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
SELECT $1, $2 || g || '.example', 'tok', 'acme' FROM generate_series(1, $3::int) g`, tenant, prefix, n)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE tenant_id = $1`, tenant)
	require.NoError(t, err)
}

// claimNames claims up to n and returns their names in the order of the claim.
func (b *bundle) claimNames(t *testing.T, n int) []string {
	t.Helper()
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, n)
	require.NoError(t, err)
	return names(claims)
}

// A tenant's bulk import never makes another tenant wait: tenant A verifies 500
// domains in one statement, the queue serves some of them, then tenant B verifies one.
// B's domain is the next claimed, not the 501st; and after it, A and a third tenant C
// take turns, one each a round, rather than C waiting for A's backlog.
func TestClaim_ALateTenantIsServedBeforeABacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, bt, c := b.tenant(t), b.tenant(t), b.tenant(t)
	b.bulk(t, a, "a", 500)
	served := b.claimNames(t, 100)
	require.Len(t, served, 100)
	b.named(t, bt, "b1.example")
	require.Equal(t, []string{"b1.example"}, b.claimNames(t, 1), "B waited behind A's backlog")

	b.bulk(t, c, "c", 3)
	next := b.claimNames(t, 6)
	var fromC int
	for _, n := range next {
		if n[0] == 'c' {
			fromC++
		}
	}
	require.Equal(t, 3, fromC, "C's three domains are not served in the next rounds: %v", next)
}

// Renewals are served by urgency: a certificate two days from expiry (a 90-day one,
// under a fifth of its lifetime left) before any first issuance, and one with 30 days
// left after them.
func TestClaim_UrgentRenewalsFirstRenewalsWithTimeToSpareLast(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	// Renewals enter the queue as the renewal pass moves them (active -> pending),
	// with their urgency; the trigger gives them their tier.
	renewal := func(name string, expiresIn time.Duration) {
		notAfter := time.Now().Add(expiresIn)
		notBefore := notAfter.Add(-90 * 24 * time.Hour)
		_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_status, ssl_provider, ssl_renew_by)
VALUES ($1, $2, 'verified', 'tok', 'active', 'acme', $3)`, tn, name, issuing.RenewBy(notBefore, notAfter, time.Time{}))
		require.NoError(t, err)
		_, err = b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_status = 'pending' WHERE domain = $1`, name)
		require.NoError(t, err)
	}
	renewal("relaxed.example", 30*24*time.Hour)
	for i := range 3 {
		b.named(t, tn, fmt.Sprintf("first%d.example", i))
	}
	renewal("urgent.example", 2*24*time.Hour)
	got := b.claimNames(t, 10)
	require.Equal(t, "urgent.example", got[0], "the renewal two days from expiry waited: %v", got)
	require.Equal(t, "relaxed.example", got[len(got)-1], "the renewal with 30 days left went first: %v", got)

	// Time alone makes a relaxed renewal urgent: promoted, it goes before the
	// first issuances queued meanwhile.
	renewal("later.example", 30*24*time.Hour)
	b.named(t, tn, "first-after.example")
	_, err := b.pool.Exec(b.ctx, `UPDATE proxy_domains SET ssl_renew_by = now() - interval '1 second' WHERE domain = 'later.example'`)
	require.NoError(t, err)
	n, err := b.q.PromoteUrgentRenewals(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, []string{"later.example", "first-after.example"}, b.claimNames(t, 10))
}

// With the ledger's account limit reached, a tenant's backlog and a newcomer wait
// together; when the window frees a slot, the newcomer's domain is the next order,
// ahead of the backlog (its place ties with the backlog's next, and it was queued
// last).
func TestClaim_AfterTheAccountLimitANewcomerIsNext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, newcomer := b.tenant(t), b.tenant(t)
	b.bulk(t, a, "a", 50)
	require.Len(t, b.claimNames(t, 10), 10)
	_, err := b.q.Pause(b.ctx, issuing.ScopeCA, testDirectory, issuing.PauseLedger, time.Hour,
		"ledger: 300 new orders from the account in 3h0m0s")
	require.NoError(t, err)
	b.named(t, newcomer, "new.example")
	require.Empty(t, b.claimNames(t, 10), "claimed while the account limit held everything")
	_, err = b.pool.Exec(b.ctx, `UPDATE certworker_pauses SET paused_until = now()`)
	require.NoError(t, err)
	require.Equal(t, []string{"new.example"}, b.claimNames(t, 1))
}
