package acme_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/issuing"
)

// logged is every logged line of obs, with its fields, as text.
func logged(obs *observer.ObservedLogs) string {
	var b strings.Builder
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	for _, e := range obs.All() {
		buf, err := enc.EncodeEntry(e.Entry, e.Context)
		if err == nil {
			b.Write(buf.Bytes())
			buf.Free()
		}
	}
	return b.String()
}

// An order that fails on the database (here it cannot be reached, when the preflight
// stores its probe token and when the account is loaded) says so in its error, which
// becomes the tenant's ssl_error, without the database's user, name, host or port;
// the log has them. Guards against the tenant reading where the proxy's database is
// and who certworker logs in as.
func TestIssue_ErrorNeverNamesTheDatabasesUserOrHost(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, false)
	addr := workertest.FreeAddr(t) // nothing listens there
	pool, err := pgxpool.New(context.Background(), "postgres://leaky_user:leaky_password@"+addr+"/leaky_db?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	host, port, _ := strings.Cut(addr, ":")
	for _, tc := range []struct {
		name      string
		preflight bool
		want      string
	}{
		{"loading the account", false, "acme: load ACME account: a database error (the details are in certworker's log)"},
		{"storing the preflight's probe token", true, "acme: preflight: store probe token: a database error (the details are in certworker's log)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			core, obs := observer.New(zap.DebugLevel)
			cfg := b.config()
			if tc.preflight {
				cfg = preflightConfig(b)
			}
			_, err := newIssuer(t, pool, zap.New(core), cfg).Issue(testCtx(t, 20*time.Second), issuing.Request{Domain: randomName("d"), DomainID: "d1"})
			require.Error(t, err)
			require.Equal(t, tc.want, err.Error())
			for _, secret := range []string{"leaky_user", "leaky_db", "leaky_password", host, port} {
				require.NotContains(t, err.Error(), secret)
			}
			log := logged(obs)
			require.Contains(t, log, "leaky_user", "the operator gets the details")
			require.Contains(t, log, `"domain_id":"d1"`)
			require.NotContains(t, log, "leaky_password")
		})
	}
}

// A stored account key sealed under a key encryption key this instance lacks fails
// the order with a *issuing.KeyError naming the missing key id for the operator, which
// the worker never records as ssl_error. Guards against key ids in the tenant's
// ssl_error through an error of another kind, which would be charged and shown.
func TestIssue_ErrorNeverNamesAKeyID(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	keyA, keyB := make([]byte, seal.KeySize), make([]byte, seal.KeySize)
	_, _ = rand.Read(keyA)
	_, _ = rand.Read(keyB)
	cfg := b.config()
	cfg.KeyEncryptionKeys = seal.Keyring{keyA}
	_, err := newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("k")})
	require.NoError(t, err, "the account is registered and sealed under key A")

	cfg.KeyEncryptionKeys = seal.Keyring{keyB}
	_, err = newIssuer(t, b.pool, nil, cfg).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: randomName("k")})
	require.Error(t, err)
	require.ErrorIs(t, err, seal.ErrUnknownKey, "the worker can still tell what it is")
	// A *issuing.KeyError is the one kind of error the worker never records as
	// ssl_error (it hands the claim back uncharged and halts: see the worker's
	// TestWorker_AKeyErrorIsNotChargedAndStopsTheInstanceClaiming), so its text may
	// name the missing key id for the operator's log; nothing else may.
	var ke *issuing.KeyError
	require.ErrorAs(t, err, &ke, "a key error that is not a *issuing.KeyError would be charged and shown to the tenant")
	require.Equal(t, seal.KeyID(keyA), ke.KeyID)
	require.NotContains(t, err.Error(), seal.KeyID(keyB))
}

// Let's Encrypt's pause of an account and name fails the domain for good, and its
// unpause link, which acts for the whole account, goes to the log (unpause_url, with
// the domain) and not into the error the tenant reads, which says where it is.
// Guards against a tenant unpausing, or reading, the operator's account.
func TestIssue_UnpauseLinkGoesToTheLogNotTheError(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	name := randomName("u")
	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Answer: pebbletest.Paused(name)})
	core, obs := observer.New(zap.DebugLevel)
	_, err := newIssuer(t, b.pool, zap.New(core), frontConfig(b, front)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name, DomainID: "u1"})
	var pe *issuing.PermanentError
	require.ErrorAs(t, err, &pe, "%T: %v", err, err)
	require.NotContains(t, err.Error(), pebbletest.UnpauseLinkPrefix)
	require.NotContains(t, err.Error(), "jwt")
	require.Contains(t, err.Error(), "an operator must unpause it with the link in certworker's log (unpause_url)")
	require.Contains(t, err.Error(), "temporarily prevented from requesting certificates for "+name, "the CA's own words stay")

	lines := obs.FilterFieldKey("unpause_url").All()
	require.Len(t, lines, 1)
	fields := lines[0].ContextMap()
	require.True(t, strings.HasPrefix(fields["unpause_url"].(string), pebbletest.UnpauseLinkPrefix), "%v", fields)
	require.Equal(t, name, fields["domain"])
	require.Equal(t, "u1", fields["domain_id"])
	require.Equal(t, zapcore.ErrorLevel, lines[0].Level)
}
