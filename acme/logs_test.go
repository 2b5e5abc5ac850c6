package acme_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
)

// No private key, the certificate's or the account's, reaches a log, at any level,
// through the issuer's logger, the responder's, or lego's (routed to zap's global
// logger). Guards against a debug line that dumps a key, the most expensive leak a
// certificate worker can have.
//
// Not parallel: it replaces zap's global logger, which lego's lines go to.
func TestIssue_KeysNeverReachLogs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	restore := zap.ReplaceGlobals(log)
	defer restore()

	b := setup(t, pebbletest.Options{}, false)
	b.respond(t, b.pool, log)
	iss := newIssuer(t, b.pool, log, b.config())
	name := randomName("logs")
	ctx := testCtx(t, 30*time.Second)
	first, err := iss.Issue(ctx, issuing.Request{DomainID: "d-logs", Domain: name})
	require.NoError(t, err)
	second, err := iss.Issue(ctx, issuing.Request{DomainID: "d-logs", Domain: name, CurrentPEM: first.ChainPEM})
	require.NoError(t, err)
	// A failing order too: errors are logged by the worker.
	failing := b.config()
	failing.DirectoryURL = "https://" + workertest.FreeAddr(t) + "/dir"
	_, failErr := newIssuer(t, b.pool, log, failing).Issue(ctx, issuing.Request{Domain: name})
	require.Error(t, failErr)

	var storedAccountKey string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT private_key_pem FROM certworker_acme_accounts").Scan(&storedAccountKey))

	var all strings.Builder
	for _, e := range logs.All() {
		fmt.Fprintf(&all, "%s %s", e.LoggerName, e.Message)
		for k, v := range e.ContextMap() {
			fmt.Fprintf(&all, " %s=%v", k, v)
		}
		all.WriteString("\n")
	}
	all.WriteString(failErr.Error())
	text := all.String()
	require.Contains(t, text, "ACME account registered", "the capture must see the issuer's lines")
	require.Contains(t, text, "lego", "the capture must see lego's lines")

	require.NotContains(t, text, "PRIVATE KEY")
	for _, keyPEM := range []string{first.PrivateKey, second.PrivateKey, storedAccountKey} {
		for _, secret := range keySecrets(t, keyPEM) {
			require.NotContains(t, text, secret, "key material in the logs")
		}
	}
}

// keySecrets are strings that would show a key in a log: each line of its PEM body
// and the whole body in one piece.
func keySecrets(t *testing.T, keyPEM string) []string {
	t.Helper()
	block, _ := pem.Decode([]byte(keyPEM))
	require.NotNil(t, block, "test issues without a key encryption key: keys are PEM")
	_, err := certcrypto.ParsePEMPrivateKey([]byte(keyPEM))
	require.NoError(t, err)
	var secrets []string
	var bodyLines []string
	for _, line := range strings.Split(keyPEM, "\n") {
		if line == "" || strings.HasPrefix(line, "-----") {
			continue
		}
		bodyLines = append(bodyLines, line)
		if len(line) >= 16 {
			secrets = append(secrets, line)
		}
	}
	secrets = append(secrets, strings.Join(bodyLines, ""))
	return secrets
}
