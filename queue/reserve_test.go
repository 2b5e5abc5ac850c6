package queue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// reserveLimits: 8 orders an hour, a quarter kept: R = 2, a tenant alone takes 6.
var reserveLimits = issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 8, Window: time.Hour}, TenantReserve: 0.25}

// bulk adds n verified domains of tenant named PREFIX-i.example.
func (b *bundle) bulkNamed(t *testing.T, tenant, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, b.named(t, tenant, fmt.Sprintf("%s-%d.example", prefix, i)))
	}
	return ids
}

// admitAll claims what is due and asks the ledger about it, settling each admitted
// order as outcome (an order the CA counts).
func (b *bundle) admitAll(t *testing.T, limits issuing.Limits, outcome string) (admitted []issuing.Claim, refused []queue.Refusal) {
	t.Helper()
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	for _, c := range admitted {
		require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, c.Token, outcome, limits))
		_, err := b.q.MarkFailed(b.ctx, c, "the CA said no")
		require.NoError(t, err)
	}
	return admitted, refused
}

// One tenant's bulk import alone takes L - R of the account's window, and its other
// rows wait, uncharged and out of line (ssl_held), under a pause of the tenant that
// says why, in `status` too. Guards against a tenant that takes every order of the
// account.
func TestTenantReserve_ABulkImportOfOneTenantAloneIsCappedAtLMinusR(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	ids := b.bulkNamed(t, tn, "bulk", 10)

	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, reserveLimits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 6, "a tenant alone takes L - R")
	require.Len(t, refused, 4)
	for _, r := range refused {
		require.Contains(t, r.Reason, "--limit-tenant-reserve 25% of --limit-orders-per-account 8/1h0m0s")
		row := b.sslRow(t, r.Claim.ID)
		require.Equal(t, "pending", row.Status, "a refused claim was not handed back")
		require.Zero(t, row.Attempts, "a refused claim was charged")
	}
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 10)
	require.NoError(t, err)
	require.Empty(t, claims, "a claim took a row the tenant reserve holds back")
	require.Equal(t, "tenant:"+tn, b.held(t, refused[0].Claim.ID), "the row waits out of line, under the tenant's pause")

	s, err := b.q.State(b.ctx, refused[0].Claim.Domain)
	require.NoError(t, err)
	require.NotNil(t, s.PauseReason, "status does not say why the domain waits")
	require.Contains(t, *s.PauseReason, "--limit-tenant-reserve")
	o, err := b.q.Overview(b.ctx)
	require.NoError(t, err)
	listed := 0
	for _, d := range o.Domains {
		if d.PauseReason != nil && strings.Contains(*d.PauseReason, "--limit-tenant-reserve") {
			listed++
		}
	}
	require.Equal(t, 4, listed, "status does not list the domains the tenant reserve holds back, with why")
	require.Len(t, ids, 10)
}

// Tenant T's twelve names fail validation at the CA over and over; tenant U's newcomer
// is still admitted at once, in the same window. Guards against the account's orders
// all going to one tenant's failing names while another's first certificate waits for
// the whole window (3 h at Let's Encrypt).
func TestTenantReserve_OneTenantsFailingNamesThenAnotherTenantsNewcomerIsAdmitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tt, u := b.tenant(t), b.tenant(t)
	b.bulkNamed(t, tt, "failing", 12)
	admitted, _ := b.admitAll(t, reserveLimits, issuing.LedgerFailedAuthz)
	require.Len(t, admitted, 6)
	// Their backoff over, T's names are due again: still held.
	b.exec(t, `UPDATE proxy_domains SET ssl_last_attempt_at = now() - interval '1 day'`)
	admitted, _ = b.admitAll(t, reserveLimits, issuing.LedgerFailedAuthz)
	require.Empty(t, admitted, "the tenant took more than L - R")

	newcomer := b.named(t, u, "newcomer.example")
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, reserveLimits, b.admissions(t, false))
	require.NoError(t, err)
	require.Empty(t, refused)
	require.Len(t, admitted, 1)
	require.Equal(t, newcomer, admitted[0].ID)
}

// Deleting its domains and adding them again does not give a tenant its orders back:
// the ledger records the tenant with each order. Guards against a cap counted through
// the domain rows, which a tenant escapes by deleting and re-adding them.
func TestTenantReserve_DeleteAndReAddDoesNotResetTheCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.bulkNamed(t, tn, "gone", 6)
	admitted, _ := b.admitAll(t, reserveLimits, issuing.LedgerFailed)
	require.Len(t, admitted, 6)
	b.exec(t, `DELETE FROM proxy_domains WHERE tenant_id = $1`, tn)
	b.exec(t, `DELETE FROM certworker_pauses`)

	b.bulkNamed(t, tn, "again", 3)
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, reserveLimits, b.admissions(t, false))
	require.NoError(t, err)
	require.Empty(t, admitted, "re-added domains reset the tenant's count")
	require.Len(t, refused, 3)
}

// A renewal, which the CA does not count against orders per account, is not held back
// by the reserve, and a reserve of 0 is off.
func TestTenantReserve_RenewalsAndAReserveOfZeroAreNotLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.bulkNamed(t, tn, "cap", 6)
	admitted, _ := b.admitAll(t, reserveLimits, issuing.LedgerFailed)
	require.Len(t, admitted, 6)
	b.exec(t, `DELETE FROM certworker_pauses`)
	b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL, ssl_attempts = 0`)
	b.exec(t, `INSERT INTO certworker_issued_names (directory, name) SELECT $1, lower(domain) FROM proxy_domains`, testDirectory)
	b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) SELECT domain, 'pem', 'key' FROM proxy_domains`)

	as := b.admissions(t, true)
	require.Len(t, as, 6)
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, reserveLimits, as[:1])
	require.NoError(t, err)
	require.Empty(t, refused, "a renewal was held back by the tenant reserve")
	require.Len(t, admitted, 1)

	off := reserveLimits
	off.TenantReserve = 0
	for i := range as[1:] {
		as[1+i].Renewal = false
	}
	admitted, refused, err = b.q.Admit(b.ctx, testDirectory, off, as[1:3])
	require.NoError(t, err)
	require.Empty(t, refused, "a reserve of 0 held a tenant back")
	require.Len(t, admitted, 2)
}

// Held back at the first CA by its reserve for longer than --acme-fallback-after, a
// domain goes to the second CA, whose own pauses (its reserve among them) it meets
// there. Guards against a reserve that keeps a domain from a CA with orders to spare.
func TestTenantReserve_AfterTheFallbackDelayTheSecondCATakesTheDomain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	id := b.named(t, tn, "second.example")
	_, err := b.q.PauseAt(b.ctx, testDirectory, issuing.ScopeTenant, tn, issuing.PauseLedger, time.Hour, "ledger: the tenant reserve")
	require.NoError(t, err)
	routed := b.routed(time.Minute)
	require.Empty(t, b.claimAll(t, routed), "a domain its tenant's reserve holds back at the first CA was claimed at once")
	b.backdate(t, id, 120, 120)
	got := b.claimAll(t, routed)
	require.Contains(t, got, id)
	require.Equal(t, secondDirectory, got[id].Directory)
	require.Equal(t, issuing.FallbackLedger, got[id].FallbackCause)
}

// A renewal admitted as such (exempt from orders per account) whose order is to go
// without "replaces" is asked about again as a new order (Readmit): then the tenant
// reserve applies to it as to any new order. Here the tenant has its L - R orders of
// the window already, so the readmission is refused, uncharged. Guards against a
// re-admission that reads the tenant's own count as nothing and lets one tenant past
// the reserve.
func TestTenantReserve_AReadmittedRenewalIsUnderTheReserve(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.bulkNamed(t, tn, "full", 6)
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, reserveLimits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 6)
	require.Empty(t, refused)

	id := b.named(t, tn, "renewed-"+tn[:8]+".example")
	c := b.claimOne(t, id)
	err = b.q.Readmit(b.ctx, testDirectory, reserveLimits, queue.Admission{Claim: c})
	var held *issuing.LedgerRefusedError
	require.ErrorAs(t, err, &held, "a readmitted order of a tenant at L - R went past the tenant reserve")
	require.Contains(t, held.Reason, "--limit-tenant-reserve")
}
