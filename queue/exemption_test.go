package queue_test

import (
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The ledger follows the CA's exemptions, in the claim and in Admit. A renewal inside
// the window last read for its certificate (an ARI renewal) passes every pause of the
// ledger and is admitted over every limit, recorded as exempt; a renewal outside it
// passes only the ledger's pauses of the account and of its registered domain, and a
// new name none. A pause of the CA's own (it answered rateLimited) holds back all of
// them: the CA said no.
func TestClaim_LedgerPausesHoldBackOnlyWhatTheirLimitCovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	inWindow := b.named(t, tn, "in.window.example")
	outside := b.named(t, tn, "out.window.example")
	fresh := b.named(t, tn, "fresh.window.example")
	b.exec(t, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, ari_window_start, ari_window_end)
VALUES ('in.window.example', 'pem', 'key', now() + interval '5 days', now() - interval '1 hour', now() + interval '1 hour'),
       ('out.window.example', 'pem', 'key', now() + interval '5 days', now() - interval '2 hours', now() - interval '1 hour')`)
	b.exec(t, `INSERT INTO certworker_issued_names (directory, name)
VALUES ($1, 'in.window.example'), ($1, 'out.window.example')`, testDirectory)
	pause := func(scope, key, source string) {
		t.Helper()
		b.exec(t, `DELETE FROM certworker_pauses`)
		b.exec(t, `INSERT INTO certworker_pauses (scope, key, source, paused_until, reason)
VALUES ($1, $2, $3, now() + interval '1 day', 'test')`, scope, key, source)
	}
	claimed := func() []string {
		t.Helper()
		ids := b.drain(t)
		b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL, ssl_claim_token = NULL,
    ssl_claimed_by = NULL, ssl_lease_expires_at = NULL WHERE id = ANY($1::uuid[])`, ids)
		return ids
	}
	for _, tc := range []struct {
		scope, key, source string
		want               []string
	}{
		{issuing.ScopeCA, testDirectory, issuing.PauseLedger, []string{inWindow, outside}},
		{issuing.ScopeRegisteredDomain, "window.example", issuing.PauseLedger, []string{inWindow, outside}},
		{issuing.ScopeDomain, "in.window.example", issuing.PauseLedger, []string{inWindow, outside, fresh}},
		{issuing.ScopeDomain, "out.window.example", issuing.PauseLedger, []string{inWindow, fresh}},
		{issuing.ScopeCA, testDirectory, issuing.PauseRateLimit, nil},
		{issuing.ScopeRegisteredDomain, "window.example", issuing.PauseRateLimit, nil},
		{issuing.ScopeDomain, "in.window.example", issuing.PauseRateLimit, []string{outside, fresh}},
	} {
		pause(tc.scope, tc.key, tc.source)
		require.ElementsMatch(t, tc.want, claimed(), "a %s pause of %s %s", tc.source, tc.scope, tc.key)
	}
}

// Admit: with every limit spent by earlier orders, the renewal inside its window is
// admitted and recorded as exempt; the one outside it is held back by the exact-set
// limit (it is exempt from the account's and the registered domain's only).
func TestAdmit_AnARIRenewalIsExemptFromEveryLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	inWindow := b.named(t, tn, "in.window.example")
	outside := b.named(t, tn, "out.window.example")
	b.exec(t, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, ari_window_start, ari_window_end)
VALUES ('in.window.example', 'pem', 'key', now() + interval '5 days', now() - interval '1 hour', now() + interval '1 hour'),
       ('out.window.example', 'pem', 'key', now() + interval '5 days', now() - interval '2 hours', now() - interval '1 hour')`)
	b.exec(t, `INSERT INTO certworker_issued_names (directory, name)
VALUES ($1, 'in.window.example'), ($1, 'out.window.example')`, testDirectory)
	hour := issuing.Limit{Count: 1, Window: time.Hour}
	b.spentBucket(t, testDirectory, "account", testDirectory, hour, 1)
	b.spentBucket(t, testDirectory, "registered_domain", "window.example", hour, 1)
	for _, n := range []string{"in.window.example", "out.window.example"} {
		b.spentBucket(t, testDirectory, "exact_set", n, hour, 1)
		b.spentBucket(t, testDirectory, "failed_authz", n, hour, 1)
	}
	limits := issuing.Limits{OrdersPerAccount: hour, CertsPerRegisteredDomain: hour, CertsPerExactSet: hour, FailedAuthzPerName: hour}
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, true))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	require.Equal(t, inWindow, admitted[0].ID)
	require.Len(t, refused, 1)
	require.Equal(t, outside, refused[0].Claim.ID)
	require.Contains(t, refused[0].Reason, "--limit-certs-per-exact-set")
	var exempt, renewal bool
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT exempt, renewal FROM certworker_ledger WHERE claim_token = $1`, admitted[0].Token).Scan(&exempt, &renewal))
	require.True(t, exempt)
	require.True(t, renewal)
}

// The window's start is recorded with its end, by a read of the renewal information
// (RecordRenewalInfo) and with a certificate just issued (MarkActive): without it the
// ledger could not tell a renewal inside the window from one after it. A read that
// brings no window keeps the last one.
func TestRecordRenewalInfo_RecordsTheWindowsStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, name := b.ariCert(t, b.tenant(t), "active", 60)
	batch, _, err := b.q.ClaimRenewalInfo(b.ctx, 1)
	require.NoError(t, err)
	require.Len(t, batch, 1)
	start, end := nowSecond().Add(-time.Hour), nowSecond().Add(time.Hour)
	_, err = b.q.RecordRenewalInfo(b.ctx, batch[0], issuing.RenewalInfo{WindowStart: start, WindowEnd: end, NextIn: time.Second})
	require.NoError(t, err)
	var gotStart, gotEnd time.Time
	read := func() {
		t.Helper()
		require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ari_window_start, ari_window_end FROM proxy_certificates WHERE domain = $1`, name).Scan(&gotStart, &gotEnd))
	}
	read()
	require.True(t, gotStart.Equal(start), "ari_window_start %s, want %s", gotStart, start)
	require.True(t, gotEnd.Equal(end))

	b.exec(t, `UPDATE proxy_certificates SET ari_next_at = now() WHERE domain = $1`, name)
	batch, _, err = b.q.ClaimRenewalInfo(b.ctx, 1)
	require.NoError(t, err)
	require.Len(t, batch, 1)
	_, err = b.q.RecordRenewalInfo(b.ctx, batch[0], issuing.RenewalInfo{NextIn: time.Hour}) // a failed read
	require.NoError(t, err)
	read()
	require.True(t, gotStart.Equal(start), "a read without a window forgot the last one's start")

	other := setup(t)
	id := other.named(t, other.tenant(t), "issued.window.example")
	c := other.claimOne(t, id)
	cert := mintCertificate(t, "issued.window.example", nowSecond().Add(-time.Hour), nowSecond().Add(90*24*time.Hour))
	cert.WindowStart, cert.WindowEnd = start, end
	require.NoError(t, other.markActive(c, cert))
	require.NoError(t, other.pool.QueryRow(other.ctx, `
SELECT ari_window_start, ari_window_end FROM proxy_certificates WHERE domain = 'issued.window.example'`).Scan(&gotStart, &gotEnd))
	require.True(t, gotStart.Equal(start), "MarkActive's ari_window_start %s, want %s", gotStart, start)
}
