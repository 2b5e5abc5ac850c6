package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// ariCert stores a 90-day certificate for a new verified ACME domain in status, as the
// worker stores one (serial, renewal time 30 days ahead), whose renewal information
// was due secsAgo seconds ago. It returns the domain's id and name.
func (b *bundle) ariCert(t *testing.T, tenant, status string, secsAgo int) (string, string) {
	t.Helper()
	id, name := b.domain(t, tenant, status, 0, nil)
	now := nowSecond()
	chain, leaf := mintPEM(t, name, now.Add(-30*day), now.Add(60*day))
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, serial,
    renew_at, ari_next_at)
VALUES ($1, $2, 'key', $3, $4, $5, now() + interval '30 days', now() - make_interval(secs => $6))`,
		name, chain, leaf.NotAfter, leaf.NotBefore, leaf.SerialNumber.Text(16), secsAgo)
	require.NoError(t, err)
	return id, name
}

// ariRow is what a certificate row holds of its renewal information, with the
// database's clock at the read.
type ariRow struct {
	NextAt, WindowEnd, RenewAt *time.Time
	Now                        time.Time
}

func (b *bundle) ariRow(t *testing.T, domain string) ariRow {
	t.Helper()
	var r ariRow
	require.NoError(t, b.pool.QueryRow(b.ctx, `
SELECT ari_next_at, ari_window_end, renew_at, now() FROM proxy_certificates WHERE domain = $1`, domain).
		Scan(&r.NextAt, &r.WindowEnd, &r.RenewAt, &r.Now))
	return r
}

func claimedDomains(cs []queue.RenewalInfoCandidate) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Domain
	}
	return out
}

// Instances share the renewal-information reads: a claim moves each read it takes
// RenewalInfoHold ahead, so the next claim (another instance's, or two at once) takes
// other rows, and no certificate is asked about twice.
func TestClaimRenewalInfo_InstancesTakeDifferentReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	due := map[string]bool{}
	for i := range 10 {
		_, name := b.ariCert(t, tn, "active", 60+i)
		due[name] = true
	}
	_, later := b.ariCert(t, tn, "active", -3600) // due in an hour

	// Two instances at once, each with a pool of its own.
	other, err := pgxpool.New(b.ctx, b.dsn)
	require.NoError(t, err)
	t.Cleanup(other.Close)
	queues := []*queue.Queue{b.q, queue.New(other, issuing.DefaultConfig())}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for _, q := range queues {
		wg.Go(func() {
			for range 10 { // more than enough for 10 reads, 3 at a time
				batch, _, err := q.ClaimRenewalInfo(context.Background(), 3)
				if err != nil || len(batch) == 0 {
					require.NoError(t, err)
					return
				}
				mu.Lock()
				for _, c := range batch {
					seen[c.Domain]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, len(due), "claimed %v", seen)
	for name, n := range seen {
		require.True(t, due[name], "%s was not due", name)
		require.Equal(t, 1, n, "%s claimed %d times", name, n)
	}
	for name := range due {
		r := b.ariRow(t, name)
		require.NotNil(t, r.NextAt)
		require.WithinDuration(t, r.Now.Add(queue.RenewalInfoHold), *r.NextAt, 5*time.Second, "%s: the claim's hold", name)
	}
	require.Positive(t, time.Until(*b.ariRow(t, later).NextAt), "a read not due was claimed")
	batch, _, err := b.q.ClaimRenewalInfo(b.ctx, 3)
	require.NoError(t, err)
	require.Empty(t, claimedDomains(batch), "claimed again inside the hold")
}

// A read that is due but not to be made moves out of the way in the claim, so that it
// does not keep the next read due now (the instances woke for it, again and again):
// an expired certificate, one that no longer renews automatically and one whose
// domain is gone are never asked about again (RFC 9773 §4.3); one whose domain is not
// active now (its renewal under way, failed, switched to manual) is looked at again
// in six hours.
func TestClaimRenewalInfo_MovesReadsNotToBeMadeOutOfTheWay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tn := b.tenant(t)
	askedID, asked := b.ariCert(t, tn, "active", 60)
	_, expired := b.ariCert(t, tn, "active", 60)
	b.exec(t, `UPDATE proxy_certificates SET expires_at = now() - interval '1 minute' WHERE domain = $1`, expired)
	_, manualRenew := b.ariCert(t, tn, "active", 60)
	b.exec(t, `UPDATE proxy_certificates SET auto_renew = false WHERE domain = $1`, manualRenew)
	goneID, gone := b.ariCert(t, tn, "active", 60)
	b.exec(t, `DELETE FROM proxy_domains WHERE id = $1`, goneID)
	_, renewing := b.ariCert(t, tn, "pending", 60)
	_, failed := b.ariCert(t, tn, "failed", 60)
	manualID, manual := b.ariCert(t, tn, "active", 60)
	b.exec(t, `UPDATE proxy_domains SET ssl_provider = 'manual' WHERE id = $1`, manualID)

	batch, swept, err := b.q.ClaimRenewalInfo(b.ctx, 16)
	require.NoError(t, err)
	require.Equal(t, []string{asked}, claimedDomains(batch))
	require.Equal(t, askedID, batch[0].DomainID)
	require.Equal(t, 6, swept)
	for _, name := range []string{expired, manualRenew, gone} {
		require.Nil(t, b.ariRow(t, name).NextAt, "%s is still asked about", name)
	}
	for _, name := range []string{renewing, failed, manual} {
		r := b.ariRow(t, name)
		require.NotNil(t, r.NextAt, name)
		require.WithinDuration(t, r.Now.Add(issuing.RenewalInfoDefault), *r.NextAt, 5*time.Second, name)
	}
	next, ok, err := b.q.NextRenewalInfo(b.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, next, queue.RenewalInfoHold-time.Minute, "a read is still due")
}

// What the CA said is written for the certificate it was asked about, never for the
// one that replaced it meanwhile (RFC 9773: a window belongs to one certificate): the
// worker's own renewal stored a new certificate with a new serial, or the proxy
// uploaded one and set renew_at itself, which leaves the old serial in place (only the
// version the trigger draws tells them apart). Written by the row's id alone, a new
// certificate would take the old one's window.
func TestRecordRenewalInfo_ACertificateReplacedMeanwhileKeepsItsOwnSchedule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, b *bundle, id, name string)
	}{
		{"renewed by the worker", func(t *testing.T, b *bundle, id, name string) {
			b.exec(t, `UPDATE proxy_domains SET ssl_status = 'pending' WHERE id = $1`, id)
			now := nowSecond()
			require.NoError(t, b.markActive(b.claimOne(t, id), mintCertificate(t, name, now, now.Add(90*day))))
		}},
		{"uploaded with a renewal time, serial left stale", func(t *testing.T, b *bundle, _, name string) {
			now := nowSecond()
			chain, _ := mintPEM(t, name, now, now.Add(90*day))
			b.exec(t, `UPDATE proxy_certificates SET certificate_pem = $2, renew_at = now() + interval '50 days',
                ari_next_at = now() + interval '6 hours' WHERE domain = $1`, name, chain)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id, name := b.ariCert(t, b.tenant(t), "active", 60)
			batch, _, err := b.q.ClaimRenewalInfo(b.ctx, 1)
			require.NoError(t, err)
			require.Len(t, batch, 1)
			tc.replace(t, b, id, name)
			before := b.ariRow(t, name)
			var renewByBefore *time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_renew_by FROM proxy_domains WHERE id = $1`, id).Scan(&renewByBefore))

			// The CA moved the old certificate's window into the past (a revocation).
			_, err = b.q.RecordRenewalInfo(b.ctx, batch[0], issuing.RenewalInfo{
				RenewNow: true, WindowEnd: time.Now().Add(-time.Minute), NextIn: time.Minute,
			})
			require.ErrorIs(t, err, issuing.ErrCertificateReplaced)
			after := b.ariRow(t, name)
			require.Equal(t, before.RenewAt, after.RenewAt, "the new certificate took the old one's renewal time")
			require.Equal(t, before.WindowEnd, after.WindowEnd, "the new certificate took the old one's window")
			require.Equal(t, before.NextAt, after.NextAt)
			var renewBy *time.Time
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_renew_by FROM proxy_domains WHERE id = $1`, id).Scan(&renewBy))
			require.Equal(t, renewByBefore, renewBy, "the domain's urgency moved")
		})
	}
}

// Every time the record writes is the database's: the delay to the next read is added
// to now(), and a window that is over renews at now(), the clock the renewal pass and
// the claim compare with. Checked inside a transaction, whose now() stands still
// behind the host's clock: the row holds exactly the transaction's time plus the
// delay.
func TestRecordRenewalInfo_WritesTheDatabasesTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, name := b.ariCert(t, b.tenant(t), "active", 60)
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(b.ctx) }()
	var txNow time.Time
	require.NoError(t, tx.QueryRow(b.ctx, `SELECT now()`).Scan(&txNow))
	q := queue.New(tx, issuing.DefaultConfig())
	batch, _, err := q.ClaimRenewalInfo(b.ctx, 1)
	require.NoError(t, err)
	require.Len(t, batch, 1)
	require.True(t, batch[0].Now.Equal(txNow), "the claim's time %s is not the database's %s", batch[0].Now, txNow)

	windowEnd := txNow.Add(-time.Hour).Truncate(time.Second)
	renewIn, err := q.RecordRenewalInfo(b.ctx, batch[0], issuing.RenewalInfo{RenewNow: true, WindowEnd: windowEnd, NextIn: 90 * time.Minute})
	require.NoError(t, err)
	require.Zero(t, renewIn)
	var nextAt, renewAt, renewBy time.Time
	require.NoError(t, tx.QueryRow(b.ctx, `
SELECT c.ari_next_at, c.renew_at, d.ssl_renew_by FROM proxy_certificates c JOIN proxy_domains d ON d.domain = c.domain
WHERE c.domain = $1`, name).Scan(&nextAt, &renewAt, &renewBy))
	require.True(t, nextAt.Equal(txNow.Add(90*time.Minute)), "ari_next_at %s, want %s", nextAt, txNow.Add(90*time.Minute))
	require.True(t, renewAt.Equal(txNow), "renew_at %s, want %s", renewAt, txNow)
	require.True(t, renewBy.Equal(windowEnd), "ssl_renew_by %s, want the window's end %s (domain %s)", renewBy, windowEnd, id)
}
