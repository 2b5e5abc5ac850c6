package queue_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// admissions claims everything due and makes the ledger's questions of the claims.
func (b *bundle) admissions(t *testing.T, renewal bool) []queue.Admission {
	t.Helper()
	claims, err := b.q.Claim(b.ctx, "test", testDirectory, 100)
	require.NoError(t, err)
	var as []queue.Admission
	for _, c := range claims {
		name, err := issuing.CheckName(c.Domain)
		require.NoError(t, err)
		as = append(as, queue.Admission{Claim: c, Name: name, RegisteredDomain: issuing.RegisteredDomain(name), Renewal: renewal})
	}
	return as
}

// spentBucket sets the bucket of kind and key at directory as if n tokens of l had
// been taken just now, as Admit and SettleLedger write it.
func (b *bundle) spentBucket(t *testing.T, directory, kind, key string, l issuing.Limit, n int) {
	t.Helper()
	b.exec(t, `
INSERT INTO certworker_buckets (directory, kind, key, tat) VALUES ($1, $2, $3, now() + make_interval(secs => $4))
ON CONFLICT (directory, kind, key) DO UPDATE SET tat = EXCLUDED.tat`,
		directory, kind, key, (time.Duration(n) * l.Interval()).Seconds())
}

func names(cs []issuing.Claim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Domain)
	}
	return out
}

// Each limit holds back what it covers, at its count, and nothing else; a refused
// claim is handed back uncharged and its key paused with the reason, so the next claim
// does not take it; a key that reaches its limit is paused at once.
func TestAdmit_EachLimitHoldsBackWhatItCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		limits   issuing.Limits
		domains  []string
		admitted int
		scope    string
		key      string
	}{
		{"orders per account", issuing.Limits{OrdersPerAccount: issuing.Limit{Count: 3, Window: time.Hour}},
			[]string{"a.one.example", "b.two.example", "c.three.example", "d.four.example", "e.five.example"}, 3,
			issuing.ScopeCA, testDirectory},
		{"certificates per registered domain", issuing.Limits{CertsPerRegisteredDomain: issuing.Limit{Count: 2, Window: time.Hour}},
			[]string{"a.shop.example", "b.shop.example", "c.shop.example", "other.example"}, 3,
			issuing.ScopeRegisteredDomain, "shop.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tn := b.tenant(t)
			ids := map[string]string{}
			for _, d := range tc.domains {
				ids[d] = b.named(t, tn, d)
			}
			var admitted []issuing.Claim
			var refused []queue.Refusal
			n := b.notifications(t, func() {
				var err error
				admitted, refused, err = b.q.Admit(b.ctx, testDirectory, tc.limits, b.admissions(t, false))
				require.NoError(t, err)
			})
			require.Zero(t, n, "a refusal woke the workers")
			require.Len(t, admitted, tc.admitted, "admitted %v", names(admitted))
			require.Len(t, refused, len(tc.domains)-tc.admitted)
			for _, r := range refused {
				row := b.sslRow(t, r.Claim.ID)
				require.Equal(t, "pending", row.Status, "a refused claim was not handed back")
				require.Zero(t, row.Attempts, "a refused claim was charged")
				require.Regexp(t, `^ledger: `, r.Reason)
			}
			// Paused until the bucket's next token: one interval (an hour over the
			// count) after the batch, not a window.
			var reason string
			interval := tc.limits.OrdersPerAccount.Interval() + tc.limits.CertsPerRegisteredDomain.Interval()
			require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT reason FROM certworker_pauses WHERE scope = $1 AND key = $2 AND source = 'ledger'
   AND paused_until BETWEEN now() + make_interval(secs => $3) - interval '1 minute' AND now() + make_interval(secs => $3)`,
				tc.scope, tc.key, interval.Seconds()).Scan(&reason))
			require.Regexp(t, `^ledger: `, reason)
			require.Empty(t, b.drain(t), "a held-back domain was claimed again")
		})
	}
}

// The exact-set and failed-authorization limits are per name: they count renewals
// too (Let's Encrypt does), while renewals (of names the CA issued for before) are
// exempt from the account and registered-domain limits.
func TestAdmit_RenewalsAreExemptOnlyWhereTheCAExemptsThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for i := range 4 {
		b.named(t, tn, fmt.Sprintf("r%d.shop.example", i))
	}
	// Names the CA issued for before (SettleLedger records them): their orders are
	// renewals there.
	b.exec(t, `INSERT INTO certworker_issued_names (directory, name)
SELECT $1, 'r' || g || '.shop.example' FROM generate_series(0, 3) g`, testDirectory)
	// And hold the certificate the renewal replaces (the claim's rule, renewalSQL).
	b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem) SELECT domain, 'pem', 'key' FROM proxy_domains`)
	limits := issuing.Limits{
		OrdersPerAccount:         issuing.Limit{Count: 1, Window: time.Hour},
		CertsPerRegisteredDomain: issuing.Limit{Count: 1, Window: time.Hour},
	}
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, true))
	require.NoError(t, err)
	require.Len(t, admitted, 4, "renewals were held back by limits Let's Encrypt exempts them from")
	require.Empty(t, refused)

	other := setup(t)
	id := other.named(t, other.tenant(t), "again.example")
	five := issuing.Limit{Count: 5, Window: time.Hour}
	other.spentBucket(t, testDirectory, "exact_set", "again.example", five, 5)
	admitted, refused, err = other.q.Admit(other.ctx, testDirectory,
		issuing.Limits{CertsPerExactSet: five}, other.admissions(t, true))
	require.NoError(t, err)
	require.Empty(t, admitted, "a renewal went past the exact-set limit, which counts renewals")
	require.Len(t, refused, 1)
	require.Equal(t, id, refused[0].Claim.ID)
}

// Two instances never exceed a limit together: the check and the record are one
// transaction under a lock every instance takes. Eight instances at once, a limit of
// three per registered domain.
func TestAdmit_ConcurrentInstancesNeverExceedALimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	for i := range 16 {
		b.named(t, tn, fmt.Sprintf("c%d.shop.example", i))
	}
	limits := issuing.Limits{CertsPerRegisteredDomain: issuing.Limit{Count: 3, Window: time.Hour}}
	var mu sync.Mutex
	total := 0
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			claims, err := b.q.Claim(b.ctx, fmt.Sprint("w", i), testDirectory, 2)
			require.NoError(t, err)
			var as []queue.Admission
			for _, c := range claims {
				as = append(as, queue.Admission{Claim: c, Name: c.Domain, RegisteredDomain: "shop.example"})
			}
			admitted, _, err := b.q.Admit(b.ctx, testDirectory, limits, as)
			require.NoError(t, err)
			mu.Lock()
			total += len(admitted)
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Equal(t, 3, total, "instances together admitted %d orders against a limit of 3", total)
	var recorded int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM certworker_ledger`).Scan(&recorded))
	require.Equal(t, 3, recorded)
}

// An order that failed no longer counts as a certificate: the ledger's pause of its
// registered domain is lifted, and the next claim counts again. A failed authorization
// counts towards its name's limit, and the last one allowed pauses the name.
func TestSettleLedger_FailuresFreeSlotsAndFailedAuthorizationsCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	b.named(t, tn, "a.shop.example")
	b.named(t, tn, "b.shop.example")
	limits := issuing.Limits{
		CertsPerRegisteredDomain: issuing.Limit{Count: 1, Window: time.Hour},
		FailedAuthzPerName:       issuing.Limit{Count: 1, Window: time.Hour},
	}
	admitted, refused, err := b.q.Admit(b.ctx, testDirectory, limits, b.admissions(t, false))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	require.Len(t, refused, 1)
	require.Empty(t, b.drain(t), "the registered domain is not paused")

	require.NoError(t, b.q.SettleLedger(b.ctx, testDirectory, admitted[0].Token, issuing.LedgerFailedAuthz, limits))
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT count(*) FROM certworker_pauses WHERE scope = 'registered_domain' AND source = 'ledger'`).Scan(&n))
	require.Zero(t, n, "a failed order still holds its registered domain's slot")
	var reason string
	require.NoError(t, b.pool.QueryRow(b.ctx,
		`SELECT reason FROM certworker_pauses WHERE scope = 'domain' AND key = $1 AND source = 'ledger'`, admitted[0].Domain).Scan(&reason))
	require.Contains(t, reason, "failed authorizations")
	claimed := b.drain(t)
	require.Len(t, claimed, 1, "the other name is due again")
	require.Equal(t, refused[0].Claim.ID, claimed[0])
}
