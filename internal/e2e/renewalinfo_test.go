package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// ariCertificates stores n active domains of the world's tenant, each with a 90-day
// certificate whose renewal information is due now. The certificates come from a CA
// of the test's own, with the authority key identifier ARI names a certificate by;
// Pebble knows none of them and answers each question with an error, which is all the
// tests here need: every question reaches the CA (CA.Requests) and is asked again
// only an hour later.
func (w *world) ariCertificates(t testing.TB, n int) []string {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now().Truncate(time.Second)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e ARI test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		SubjectKeyId: []byte{1, 2, 3, 4},
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	names := make([]string, n)
	for i := range names {
		names[i] = randomName("ari")
	}
	ids := w.addDomains(t, names...)
	for i, name := range names {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
		require.NoError(t, err)
		notBefore, notAfter := now.Add(-10*24*time.Hour), now.Add(80*24*time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
			NotBefore: notBefore, NotAfter: notAfter,
		}, ca, &caKey.PublicKey, caKey)
		require.NoError(t, err)
		chain := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + string(caPEM)
		_, err = w.pool.Exec(w.ctx, `
WITH d AS (UPDATE proxy_domains SET ssl_status = 'active', ssl_expires_at = $3 WHERE id = $5)
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, not_before, serial,
    renew_at, ari_next_at)
VALUES ($1, $2, 'key', $3, $4, $6, now() + interval '50 days', now())`,
			name, chain, notAfter, notBefore, ids[i], serial.Text(16))
		require.NoError(t, err)
	}
	return names
}

// abandonedClaim stores a domain claimed by an instance that is gone, whose lease runs
// out lease from now.
func (w *world) abandonedClaim(t testing.TB, lease time.Duration) string {
	t.Helper()
	id := w.addDomains(t, randomName("abandoned"))[0]
	_, err := w.pool.Exec(w.ctx, `
UPDATE proxy_domains SET ssl_status = 'provisioning', ssl_claim_token = gen_random_uuid(), ssl_claimed_by = 'gone/0',
    ssl_last_attempt_at = now(), ssl_lease_expires_at = now() + make_interval(secs => $2)
WHERE id = $1`, id, lease.Seconds())
	require.NoError(t, err)
	return id
}

// A CA whose renewal information hangs delays nothing else: the reads run in a
// goroutine of their own, a handful at once, each bounded by its own timeout, and an
// abandoned claim is reclaimed within the lease plus the reclaim's own interval. The
// maintenance asked the CA about up to 100 certificates, one at a time and 30 s each,
// before it reclaimed: a CA that hangs delayed a 3 s-lease reclaim by minutes.
func TestE2E_HangingRenewalInformationDoesNotHoldUpTheReclaim(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	front.Add(pebbletest.Rule{Step: pebbletest.StepRenewalInfo, Answer: pebbletest.Answer{Stall: time.Hour}})
	acfg := w.acmeConfig()
	acfg.DirectoryURL = front.DirectoryURL
	w.ariCertificates(t, 40)
	const lease, poll = 3 * time.Second, time.Second
	id := w.abandonedClaim(t, lease)

	start := time.Now()
	in := w.startWorker(t, "w", acfg, worker.Config{Queue: issuing.Config{Lease: lease}, Concurrency: 1, PollInterval: poll,
		ShutdownGrace: time.Second})
	// The lease, then the reclaim's own wait (a full lease of this instance being up,
	// then its timer, capped by the poll interval), with room for a loaded machine;
	// 40 reads of 10 s one after the other would take 400 s.
	in.WaitForLog(t, "domain was left mid-issuance by an instance that stopped; requeued", 1, lease+lease+poll+15*time.Second)
	t.Logf("reclaimed %s after the start, with the CA's renewal information hanging", time.Since(start).Round(10*time.Millisecond))
	require.GreaterOrEqual(t, w.domain(t, id).Attempts, 1, "the reclaim counts the attempt")
	require.Positive(t, front.Answered()[pebbletest.StepRenewalInfo], "no renewal information was asked for: the test shows nothing")
}

// The fleet's instances share the renewal-information reads and one budget at the
// CA: two instances, 24 certificates due at once, --ari-requests-per-second 4. Each
// certificate is asked about once (not once per instance), and at no moment has the
// CA seen more than the budget allows since the start (a second's worth, then 4 a
// second). Before, each instance asked about every due certificate, as fast as the
// CA answered.
func TestE2E_TwoInstancesShareTheRenewalInformationBudget(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	const n, rate = 24, 4.0
	w.ariCertificates(t, n)
	asked := func() int { return w.ca.Requests()[pebbletest.StepRenewalInfo] }
	require.Zero(t, asked())

	start := time.Now()
	cfg := worker.Config{Concurrency: 1, PollInterval: time.Second, RenewalInfoPerSecond: rate}
	a := w.startWorker(t, "a", w.acmeConfig(), cfg)
	b := w.startWorker(t, "b", w.acmeConfig(), cfg)
	most := 0.0 // the highest share of the budget seen
	waitFor(t, time.Minute, "every certificate asked about", func() bool {
		got := asked()
		allowed := rate + rate*time.Since(start).Seconds() // read after the count: never less than it was then
		require.LessOrEqual(t, float64(got), allowed, "%d questions %s after the start", got, time.Since(start))
		most = max(most, float64(got)/allowed)
		return got >= n
	})
	// Long enough for a second question about any certificate to show (the CA's
	// answers here are errors: a certificate is asked about again in an hour).
	time.Sleep(2 * time.Second)
	require.Equal(t, n, asked(), "questions to the CA for %d certificates", n)
	reads := a.Metric(t, "certworker_renewal_info_reads_total", "refused") +
		b.Metric(t, "certworker_renewal_info_reads_total", "refused")
	require.Equal(t, float64(n), reads, "reads recorded by the two instances")
	t.Logf("instance a read %.0f, b %.0f; at most %.0f%% of the budget in use", a.Metric(t, "certworker_renewal_info_reads_total", "refused"),
		b.Metric(t, "certworker_renewal_info_reads_total", "refused"), most*100)
}
