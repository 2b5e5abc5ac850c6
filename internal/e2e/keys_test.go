package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// A rotation half rolled out, through the real `run`: an instance started with the
// old key (from --key-encryption-key-file) says at start that it seals, under which
// key id, and /metrics says so. Another instance, already given the new key, then
// registers the account under it. The old instance's /readyz turns 503 naming the
// key id; its next order is handed back uncharged, it claims nothing more, and the
// log names the key id but never a key. Restarted with only the old key it exits 2
// naming the flag and the key id; with both keys it issues the domain on the same
// account. Guards against the review's finding: the instance stayed ready and
// charged every due domain until all were failed.
func TestProcess_AnInstanceWithoutTheNewKeyStopsAndChargesNothing(t *testing.T) {
	t.Parallel()
	w := newProcessWorld(t, pebbletest.Options{})
	oldKey, newKey := make([]byte, seal.KeySize), make([]byte, seal.KeySize)
	_, _ = rand.Read(oldKey) // never fails (Go 1.24)
	_, _ = rand.Read(newKey)
	oldID, newID := seal.KeyID(oldKey), seal.KeyID(newKey)
	dir := t.TempDir()
	keyFile := func(name string, keys ...[]byte) string {
		var list []string
		for _, k := range keys {
			list = append(list, base64.StdEncoding.EncodeToString(k))
		}
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(strings.Join(list, ",")+"\n"), 0o600))
		return path
	}
	oldOnly, both := keyFile("old", oldKey), keyFile("both", newKey, oldKey)
	http01 := fmt.Sprintf("127.0.0.1:%d", w.ca.HTTPPort)
	common := []string{"--http01-listen", http01, "--poll-interval", "1s", "--retry-base", "1s"}

	a := startProc(t, "old key", w.dsn, w.ca.DirectoryURL, w.rootsFile, append(common, "--key-encryption-key-file", oldOnly)...)
	waitFor(t, 30*time.Second, "/readyz to answer 200", func() bool { code, _ := a.get("/readyz"); return code == http.StatusOK })
	code, metrics := a.get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, metrics, "certworker_key_encryption_enabled 1")
	require.Contains(t, a.logs.String(), `"msg":"new private keys will be sealed (AES-256-GCM)","sealed":true,"sealing_key_id":"`+oldID+`"`)

	// Another instance, given the new key first, registers the account. Its order's
	// token is answered by the old instance's responder: tokens live in the database.
	reg, err := acme.New(w.ctx, w.pool, zap.NewNop(), acme.Config{Recorder: queue.New(w.pool, issuing.DefaultConfig()), DirectoryURL: w.ca.DirectoryURL, CABundle: w.rootsFile,
		HTTPTimeout: 10 * time.Second, KeyEncryptionKeys: seal.Keyring{newKey, oldKey}, Profile: pebbletest.DefaultProfile})
	require.NoError(t, err)
	_, err = reg.Issue(w.ctx, issuing.Request{Domain: randomName("registers")})
	require.NoError(t, err)
	waitFor(t, 10*time.Second, "/readyz to answer 503", func() bool { code, _ := a.get("/readyz"); return code == http.StatusServiceUnavailable })
	_, body := a.get("/readyz")
	require.Contains(t, body, "cannot open the stored ACME account key")
	require.Contains(t, body, "(key id "+newID+")")

	id := w.addDomains(t, randomName("halted"))[0]
	// The order's outcome is counted once it is over, just after the hand-back's log
	// line, and the line reaches the test through a pipe: wait for both.
	waitFor(t, 30*time.Second, "the order to be handed back and counted", func() bool {
		_, metrics = a.get("/metrics")
		return strings.Contains(metrics, `certworker_issuance_total{outcome="key_error"} 1`) &&
			strings.Contains(a.logs.String(), "order handed back: a stored key does not open; not charged")
	})
	d := w.domain(t, id)
	require.Equal(t, "pending", d.Status)
	require.Zero(t, d.Attempts, "the key error was charged")
	require.Nil(t, d.Error)
	require.Contains(t, a.logs.String(), `"key_id":"`+newID+`"`)
	// Woken again (each notification sent after the count is read starts a pass
	// after it), it claims nothing: still the one claim.
	wakes := metricSum(t, metrics, `certworker_wakeups_total{source="notify"}`)
	waitFor(t, 10*time.Second, "a pass after the hand-back", func() bool {
		_, err := w.pool.Exec(w.ctx, "NOTIFY certworker_wake")
		require.NoError(t, err)
		_, metrics = a.get("/metrics")
		return metricSum(t, metrics, `certworker_wakeups_total{source="notify"}`) > wakes
	})
	require.Equal(t, 1.0, metricSum(t, metrics, "certworker_claims_total{"), "claimed after its key error")
	_, body = a.get("/readyz")
	require.Contains(t, body, "stopped claiming until restarted with the key")
	for _, k := range [][]byte{oldKey, newKey} {
		require.NotContains(t, a.logs.String(), base64.StdEncoding.EncodeToString(k), "a key reached the log")
	}
	require.Equal(t, 0, a.stop(t, 30*time.Second))

	stale := startProc(t, "old key again", w.dsn, w.ca.DirectoryURL, w.rootsFile, append(common, "--key-encryption-key-file", oldOnly)...)
	select {
	case <-stale.done:
	case <-time.After(30 * time.Second):
		t.Fatal("run started with a key that does not open the account key")
	}
	require.Equal(t, 2, stale.cmd.ProcessState.ExitCode(), stale.logs.String())
	require.Contains(t, stale.logs.String(), "--key-encryption-key (key id "+newID+")")
	require.Equal(t, 0, w.domain(t, id).Attempts)

	startProc(t, "both keys", w.dsn, w.ca.DirectoryURL, w.rootsFile, append(common, "--key-encryption-key-file", both)...)
	waitFor(t, 60*time.Second, "the domain to be issued", func() bool { return w.domain(t, id).Status == "active" })
	require.Equal(t, 1, w.ca.NewAccounts(), "a second account was registered")
}

// metricSum adds up the values of the series in a /metrics body whose line starts
// with prefix (a name and the start of its labels).
func metricSum(t *testing.T, body, prefix string) float64 {
	t.Helper()
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		require.NoError(t, err, line)
		sum += v
	}
	return sum
}
