package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pgtest"
)

const rekeyDirectory = "https://ca.example/directory"

// rekeyBed is a database holding keys in every format, and the two keys of a
// rotation.
type rekeyBed struct {
	ctx            context.Context
	dsn            string
	pool           *pgxpool.Pool
	oldKey, newKey []byte
	// plain is each row's key PEM, by row name (a domain, or the directory).
	plain map[string]string
}

func newKEK(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, seal.KeySize)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

func keyPEM(name string) string {
	return "-----BEGIN PRIVATE KEY-----\n" + base64.StdEncoding.EncodeToString([]byte("key of "+name)) + "\n-----END PRIVATE KEY-----\n"
}

// v1 is key sealed in the format the worker wrote before rotation: v2 without the
// key id.
func v1(t *testing.T, kek []byte, plain, aad string) string {
	t.Helper()
	v2, err := seal.Keyring{kek}.Seal([]byte(plain), aad)
	require.NoError(t, err)
	return seal.PrefixV1 + v2[strings.LastIndex(v2, ":")+1:]
}

func v2(t *testing.T, kek []byte, plain, aad string) string {
	t.Helper()
	s, err := seal.Keyring{kek}.Seal([]byte(plain), aad)
	require.NoError(t, err)
	return s
}

// setupRekey stores certificate keys as v1 and v2 under the old key, as PEM, and v2
// under the new key, and the account's key as v1 under the old key. The row stored
// as Mixed.Example checks that the AAD is the name in lower case.
func setupRekey(t *testing.T) *rekeyBed {
	t.Helper()
	b := &rekeyBed{ctx: context.Background(), dsn: pgtest.NewDB(t), oldKey: newKEK(t), newKey: newKEK(t), plain: map[string]string{}}
	var err error
	b.pool, err = pgxpool.New(b.ctx, b.dsn)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	for name, stored := range map[string]func(plain string) string{
		"v1-old.example":    func(p string) string { return v1(t, b.oldKey, p, "v1-old.example") },
		"v2-old.example":    func(p string) string { return v2(t, b.oldKey, p, "v2-old.example") },
		"Mixed.Example":     func(p string) string { return v2(t, b.oldKey, p, "mixed.example") },
		"pem.example":       func(p string) string { return p },
		"v2-new.example":    func(p string) string { return v2(t, b.newKey, p, "v2-new.example") },
		"changing.example":  func(p string) string { return v1(t, b.oldKey, p, "changing.example") },
		"renewing.example":  func(p string) string { return v1(t, b.oldKey, p, "renewing.example") },
		"untouched.example": func(p string) string { return v2(t, b.oldKey, p, "untouched.example") },
	} {
		b.plain[name] = keyPEM(name)
		b.storeKey(t, name, stored(b.plain[name]))
	}
	b.plain[rekeyDirectory] = keyPEM("the account")
	_, err = b.pool.Exec(b.ctx, `INSERT INTO certworker_acme_accounts (directory, private_key_pem, uri) VALUES ($1, $2, 'https://ca.example/acct/1')`,
		rekeyDirectory, v1(t, b.oldKey, b.plain[rekeyDirectory], rekeyDirectory))
	require.NoError(t, err)
	return b
}

// storeKey writes a certificate row's key as the worker's upsert does.
func (b *rekeyBed) storeKey(t *testing.T, domain, stored string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at) VALUES ($1, 'chain', $2, now() + interval '90 days')
ON CONFLICT (domain) DO UPDATE SET private_key_pem = EXCLUDED.private_key_pem`, domain, stored)
	require.NoError(t, err)
}

// stored is every key as stored, by row name.
func (b *rekeyBed) stored(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	rows, err := b.pool.Query(b.ctx, `SELECT domain, private_key_pem FROM proxy_certificates
UNION ALL SELECT directory, private_key_pem FROM certworker_acme_accounts`)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var name, key string
		require.NoError(t, rows.Scan(&name, &key))
		out[name] = key
	}
	require.NoError(t, rows.Err())
	return out
}

func (b *rekeyBed) flag() string {
	return base64.StdEncoding.EncodeToString(b.newKey) + "," + base64.StdEncoding.EncodeToString(b.oldKey)
}

// rekeyer is a rekeyer for the rotation's keys (new, old) on the bed's database.
func (b *rekeyBed) rekeyer(t *testing.T, batch int) (*rekeyer, seal.Keyring) {
	t.Helper()
	keys, err := seal.ParseKeyring(b.flag())
	require.NoError(t, err)
	return newRekeyer(b.pool, keys, batch), keys
}

// aad is what a row's key is bound to: the domain in lower case, or the directory.
func aad(name string) string {
	if name == rekeyDirectory {
		return name
	}
	return strings.ToLower(name)
}

// requireAllCurrent checks that every key is sealed v2 under the new key alone and
// opens to the PEM it held.
func (b *rekeyBed) requireAllCurrent(t *testing.T) {
	t.Helper()
	newOnly := seal.Keyring{b.newKey}
	for name, stored := range b.stored(t) {
		require.True(t, newOnly.Current(stored), "%s: %.40s", name, stored)
		plain, err := newOnly.Open(stored, aad(name))
		require.NoError(t, err, name)
		require.Equal(t, b.plain[name], string(plain), name)
	}
}

// rekey re-seals every key, of both tables and every format, with the first key, so
// that the old key can then be dropped; it says how many, and a second run finds
// nothing to do. Guards against a rotation that leaves keys only the old key opens,
// which would break the proxy the day the old key is removed.
func TestRekey_ResealsEveryKeyWithTheFirstKey(t *testing.T) {
	t.Parallel()
	b := setupRekey(t)
	code, stdout, stderr := invoke(t, "rekey", "--database-url", b.dsn, "--key-encryption-key", b.flag(), "--batch-size", "3")
	require.Equal(t, exitOK, code, stderr)
	keyID := seal.KeyID(b.newKey)
	require.Equal(t, fmt.Sprintf("re-sealed 8 keys with key %s (7 certificate keys, 1 ACME account keys; 1 of them were stored as PEM); 1 were already sealed with it\n", keyID), stdout)
	b.requireAllCurrent(t)

	code, stdout, stderr = invoke(t, "rekey", "--database-url", b.dsn, "--key-encryption-key", b.flag())
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "re-sealed 0 keys")
	require.Contains(t, stdout, "9 were already sealed with it")
}

// A key that opens with none of the given keys makes rekey refuse before it writes
// anything, naming the row. Guards against a rekey with a mistyped key list
// re-sealing half the table and leaving the operator to find out which half.
func TestRekey_RefusesAndChangesNothingWhenAKeyDoesNotOpen(t *testing.T) {
	t.Parallel()
	b := setupRekey(t)
	b.storeKey(t, "stranger.example", v2(t, newKEK(t), keyPEM("stranger"), "stranger.example"))
	b.storeKey(t, "moved.example", v2(t, b.oldKey, keyPEM("moved"), "another-row.example"))
	before := b.stored(t)

	code, stdout, stderr := invoke(t, "rekey", "--database-url", b.dsn, "--key-encryption-key", b.flag())
	require.Equal(t, exitFailed, code, stdout)
	require.Contains(t, stderr, "refused, nothing changed: 2 stored keys open with none of the given keys")
	require.Contains(t, stderr, "certificate key of stranger.example")
	require.Contains(t, stderr, "certificate key of moved.example")
	require.Equal(t, before, b.stored(t), "nothing may change")
}

// Workers keep storing keys while rekey runs: a row that changed between rekey's
// read and its write is never overwritten with the key rekey read. A key the worker
// sealed with the new key is left as the worker wrote it; one a worker still on the
// old key list sealed is read again and re-sealed. Guards against rekey putting back
// the previous certificate's key beside a renewed certificate.
func TestRekey_DoesNotOverwriteARowThatChangedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setupRekey(t)
	r, _ := b.rekeyer(t, 100)
	renewedNew, renewedOld := keyPEM("renewed under the new key"), keyPEM("renewed under the old key")
	var once sync.Once
	r.beforeUpdate = func() {
		once.Do(func() {
			b.storeKey(t, "renewing.example", v2(t, b.newKey, renewedNew, "renewing.example"))
			b.storeKey(t, "changing.example", v2(t, b.oldKey, renewedOld, "changing.example"))
		})
	}
	res, err := r.run(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 6, res.resealed["certificate key"], "renewing.example was re-sealed by its worker, not by rekey")

	b.plain["renewing.example"], b.plain["changing.example"] = renewedNew, renewedOld
	b.requireAllCurrent(t)
	require.Equal(t, v2Prefix(b.newKey), b.stored(t)["renewing.example"][:len(v2Prefix(b.newKey))])
}

func v2Prefix(kek []byte) string { return seal.PrefixV2 + seal.KeyID(kek) + ":" }

func TestRekey_FlagErrorsExitTwo(t *testing.T) {
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY", "")
	dsn := pgtest.NewDB(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rekey", "--database-url", dsn}, "--key-encryption-key is required"},
		{[]string{"rekey", "--database-url", dsn, "--key-encryption-key", "c2hvcnQ="}, "--key-encryption-key: key 1 of 1"},
		{[]string{"rekey", "--database-url", dsn, "--key-encryption-key", base64.StdEncoding.EncodeToString(newKEK(t)), "--batch-size", "0"}, "--batch-size"},
	} {
		code, _, stderr := invoke(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want)
	}
	code, stdout, _ := invoke(t, "rekey", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "--batch-size")
}

// rekey run as the workers' role (deploy/grants.sql: no UPDATE on
// certworker_acme_accounts) refuses before it writes anything, with exit 2, naming the
// role and each right it lacks. Guards against the run the review saw: the
// certificate keys re-sealed, then "permission denied for table
// certworker_acme_accounts", and a rotation left half done by a role that could never
// finish it.
func TestRekey_RefusesUnderTheWorkersRoleBeforeChangingAnything(t *testing.T) {
	t.Parallel()
	b := setupRekey(t)
	workersDSN := leastPrivilegeRole(t, b.dsn)
	before := b.stored(t)

	code, stdout, stderr := invoke(t, "rekey", "--database-url", workersDSN, "--key-encryption-key", b.flag())
	require.Equal(t, exitUsage, code, "stdout %s\nstderr %s", stdout, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "--database-url: role \"certworker_run_")
	require.Contains(t, stderr, "UPDATE (private_key_pem) on certworker_acme_accounts")
	require.Contains(t, stderr, "nothing changed")
	require.NotContains(t, stderr, "run-secret", "the password never reaches a message")
	require.NotContains(t, stderr, "permission denied")
	require.Equal(t, before, b.stored(t), "nothing may change")
}

// A rekey that stops half way (killed, or an error after some batches) has re-sealed
// the batches it wrote and left every other key as it was, each still opening to the
// key it held; the next run re-seals the rest. Guards against a batch that is not one
// transaction (a key half written) and against a run that cannot pick up after an
// interrupted one, which would leave a rotation that can never drop its old key.
func TestRekey_ARunStoppedHalfWayIsFinishedByTheNext(t *testing.T) {
	t.Parallel()
	b := setupRekey(t)
	r, keys := b.rekeyer(t, 2)
	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	batches := 0
	r.beforeUpdate = func() {
		// The third batch's write is stopped as a kill would stop it.
		if batches++; batches == 3 {
			stop()
		}
	}
	_, err := r.run(ctx)
	require.ErrorIs(t, err, context.Canceled)

	current := 0
	for name, stored := range b.stored(t) {
		if (seal.Keyring{b.newKey}).Current(stored) {
			current++
		}
		plain, err := keys.Open(stored, aad(name))
		require.NoError(t, err, "%s was lost", name)
		require.Equal(t, b.plain[name], string(plain), name)
	}
	// Two batches written (pages of two rows, less what was current already:
	// v2-new.example), the third stopped: some keys, not all.
	resealed := current - 1
	require.GreaterOrEqual(t, resealed, 2, "the batches written before the stop")
	require.LessOrEqual(t, resealed, 4, "the stopped batch wrote nothing")

	code, stdout, stderr := invoke(t, "rekey", "--database-url", b.dsn, "--key-encryption-key", b.flag())
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, fmt.Sprintf("re-sealed %d keys", 8-resealed))
	b.requireAllCurrent(t)
}
