package e2e

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"testing"
	"time"

	"github.com/go-acme/lego/v4/certificate"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// A renewal's finalize reaches the CA, and its process is killed before the answer
// (the front holds it). Another process takes the domain once the lease has run out,
// resumes the recorded order and stores its certificate: the stored certificate
// comes from the order naming the certificate it replaces, and the CA issued one new
// certificate for the renewal. The CA answers new orders as Boulder does, so an order
// placed again would be refused (alreadyReplaced) and, sent without "replaces", lose
// the renewal's exemption.
func TestProcess_ARenewalKilledAtItsFinalizeIsResumedWithItsReplaces(t *testing.T) {
	t.Parallel()
	w := newProcessWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	front.SetReplacesAsBoulder(true)
	flags := []string{"--http01-listen", fmt.Sprintf("127.0.0.1:%d", w.ca.HTTPPort),
		"--lease", "3s", "--poll-interval", "1s", "--retry-base", "1s"}
	a := startProc(t, "a", w.dsn, front.DirectoryURL, w.rootsFile, flags...)
	name := randomName("resume")
	id := w.addDomains(t, name)[0]
	waitFor(t, time.Minute, "the first certificate", func() bool { return w.domain(t, id).Status == "active" })
	var firstPEM string
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&firstPEM))

	hold := make(chan struct{})
	defer close(hold)
	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Times: 1, Answer: pebbletest.Answer{Hold: hold}})
	// The proxy asks for a new certificate (a key compromise): a renewal naming the
	// stored one.
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the renewal's finalize at the CA", func() bool { return front.Holding() == 1 })
	require.NoError(t, a.cmd.Process.Kill())
	<-a.done

	b := startProc(t, "b", w.dsn, front.DirectoryURL, w.rootsFile, flags...)
	waitFor(t, time.Minute, "the renewal stored", func() bool {
		var pem string
		require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT certificate_pem FROM proxy_certificates WHERE domain = $1`, name).Scan(&pem))
		return pem != firstPEM && w.domain(t, id).Status == "active"
	})
	orders := ordersFor(w.ca, name)
	require.Len(t, orders, 2, "the renewal was ordered again instead of resumed")
	wantID, err := certificate.MakeARICertID(parseLeaf(t, firstPEM))
	require.NoError(t, err)
	require.Equal(t, wantID, orders[1].Replaces, "the stored certificate's order names the one it replaces")
	require.Equal(t, 2, finalized(w.ca, name), "one finalize for each certificate")
	require.Len(t, w.ca.IssuedSerials(), 2, "one new certificate for the renewal")
	require.Contains(t, b.logs.String(), "resuming the recorded order")
	var recorded int
	require.NoError(t, w.pool.QueryRow(w.ctx, `SELECT count(*) FROM certworker_orders WHERE domain_id = $1`, id).Scan(&recorded))
	require.Zero(t, recorded, "the order is forgotten once its certificate is stored")
}

// parseLeaf is the first certificate of a PEM chain.
func parseLeaf(t *testing.T, chainPEM string) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode([]byte(chainPEM))
	require.NotNil(t, block)
	leaf, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	return leaf
}

// The same with the database cut instead of a kill: instance A reaches PostgreSQL
// through a relay, which is cut while its renewal's finalize is held at the CA's
// front. A's lease deadline passes mid-order, and it sends the CA nothing more.
// Instance B reclaims the domain once A's lease has run out and resumes the recorded
// order: one new certificate, from the order naming the one it replaces, stored by B.
// A, back on the database, finds its claim gone and writes nothing.
func TestPartition_ARenewalCutOffAtItsFinalizeIsResumedWithItsReplaces(t *testing.T) {
	t.Parallel()
	w := newWorld(t, pebbletest.Options{})
	front := pebbletest.NewFront(t, w.ca)
	front.SetReplacesAsBoulder(true)
	relay, cutOffDSN := workertest.Relayed(t, w.dsn)
	cfg := worker.Config{Queue: issuing.Config{Lease: partitionLease, RetryBase: time.Second},
		Concurrency: 1, PollInterval: time.Second}
	viaFront := w.acmeConfig()
	viaFront.DirectoryURL = front.DirectoryURL
	a := w.startWorkerOn(t, "cut-off", cutOffDSN, viaFront, cfg)
	name := randomName("cut")
	id := w.addDomains(t, name)[0]
	waitFor(t, time.Minute, "the first certificate", func() bool { return w.domain(t, id).Status == "active" })
	firstSerial := w.serialOf(t, name)

	hold := make(chan struct{})
	defer close(hold)
	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Times: 1, Answer: pebbletest.Answer{Hold: hold}})
	_, err := w.pool.Exec(w.ctx, `UPDATE proxy_domains SET ssl_status = 'pending', ssl_last_attempt_at = NULL WHERE id = $1`, id)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the renewal's finalize at the CA", func() bool { return front.Holding() == 1 })
	relay.Cut()
	b := w.startWorker(t, "healthy", viaFront, cfg)
	waitFor(t, time.Minute, "B to store the renewal", func() bool {
		return w.domain(t, id).Status == "active" && w.serialOf(t, name) != firstSerial
	})
	relay.Restore()
	a.WaitForLog(t, orderStoppedAtDeadline, 1, time.Minute)

	orders := ordersFor(w.ca, name)
	require.Len(t, orders, 2, "the renewal was ordered again instead of resumed")
	require.Equal(t, firstSerial, replacedSerial(t, orders[1].Replaces), "the stored certificate's order names the one it replaces")
	require.Equal(t, 2, finalized(w.ca, name))
	require.Len(t, w.ca.IssuedSerials(), 2, "one new certificate for the renewal")
	b.WaitForMetric(t, 1, 10*time.Second, "certworker_issuance_total", "issued") // B stored the renewal
	require.Equal(t, 1.0, a.Metric(t, "certworker_issuance_total", "issued"), "A stored the renewal too")
}
