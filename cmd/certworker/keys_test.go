package main

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/internal/pgtest"
)

// writeKeyFile writes content to a file of the test's and returns its path.
func writeKeyFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kek")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// --key-encryption-key-file (and its variable) gives run and rekey the same list as
// --key-encryption-key, read from a file, so that the keys stay off command lines
// and out of `docker inspect`: rekey seals with the file's first key, the trailing
// newline of the file ignored. A file that cannot be read or holds no valid list,
// and both ways set at once, exit 2 naming the flag, before anything connects, and
// never print a key. Guards against a worker that starts without keys because its
// secret was not mounted, and against a leftover variable silently choosing the keys.
func TestKeyEncryptionKeyFile_ReadsTheListAndRefusesWhatIsWrong(t *testing.T) {
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY", "")
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY_FILE", "")
	b := setupRekey(t)
	good := writeKeyFile(t, b.flag()+"\n")
	code, stdout, stderr := invoke(t, "rekey", "--database-url", b.dsn, "--key-encryption-key-file", good)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "with key "+seal.KeyID(b.newKey))
	b.requireAllCurrent(t)
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY_FILE", good)
	code, stdout, stderr = invoke(t, "rekey", "--database-url", b.dsn)
	require.Equal(t, exitOK, code, "the variable: %s", stderr)
	require.Contains(t, stdout, "re-sealed 0 keys")
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY_FILE", "")

	secret := base64.StdEncoding.EncodeToString(b.newKey)
	short := writeKeyFile(t, "c2hvcnQ=\n")
	empty := writeKeyFile(t, "\n")
	missing := filepath.Join(t.TempDir(), "missing")
	readable := writeKeyFile(t, b.flag()+"\n")
	require.NoError(t, os.Chmod(readable, 0o644))
	// Nothing is reached: every refusal comes before the connection.
	const nowhere = "postgres://x:y@127.0.0.1:1/none"
	for _, cmd := range []string{"run", "rekey"} {
		for _, tc := range []struct {
			name string
			env  map[string]string
			args []string
			want string
		}{
			{"missing", nil, []string{"--key-encryption-key-file", missing}, "--key-encryption-key-file: open " + missing + ": no such file or directory"},
			{"malformed", nil, []string{"--key-encryption-key-file", short}, "--key-encryption-key-file " + short + ": key 1 of 1: must be base64 of 32 bytes"},
			{"empty", nil, []string{"--key-encryption-key-file", empty}, "--key-encryption-key-file " + empty + ": the file holds no key"},
			{"readable by others", nil, []string{"--key-encryption-key-file", readable}, "--key-encryption-key-file " + readable + ": mode 0644"},
			{"both flags", nil, []string{"--key-encryption-key", secret, "--key-encryption-key-file", good}, "--key-encryption-key and --key-encryption-key-file are both set"},
			{"flag and variable", map[string]string{"CERTWORKER_KEY_ENCRYPTION_KEY": secret}, []string{"--key-encryption-key-file", good}, "are both set"},
			{"variables", map[string]string{"CERTWORKER_KEY_ENCRYPTION_KEY": secret, "CERTWORKER_KEY_ENCRYPTION_KEY_FILE": good}, nil, "are both set"},
		} {
			t.Run(cmd+" "+tc.name, func(t *testing.T) {
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				code, stdout, stderr := invoke(t, append([]string{cmd, "--database-url", nowhere}, tc.args...)...)
				require.Equal(t, exitUsage, code, stderr)
				require.Empty(t, stdout)
				require.Contains(t, stderr, tc.want)
				require.NotContains(t, stderr, secret)
			})
		}
	}
}

// `run` opens the stored ACME account key before it claims anything: sealed under a
// key it was not given, run exits 2 naming --key-encryption-key and the key id it
// lacks (v1 names none: the message gives the ids it tried), with the keys given on
// the command line or in a file, and claims nothing. Guards against the review's
// finding: a worker started with only the old key after a rekey reported ready and
// charged every due domain "not in --key-encryption-key" until all had failed.
func TestRun_ExitsTwoWhenTheStoredAccountKeyDoesNotOpen(t *testing.T) {
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY", "")
	t.Setenv("CERTWORKER_KEY_ENCRYPTION_KEY_FILE", "")
	b := setupRekey(t)
	id := pgtest.Domain(t, b.pool, pgtest.Tenant(t, b.pool), "due.example")
	oldOnly := base64.StdEncoding.EncodeToString(b.oldKey)
	newID, oldID := seal.KeyID(b.newKey), seal.KeyID(b.oldKey)
	storeAccount := func(stored string) {
		_, err := b.pool.Exec(b.ctx, `UPDATE certworker_acme_accounts SET private_key_pem = $1`, stored)
		require.NoError(t, err)
	}
	v2New := v2(t, b.newKey, b.plain[rekeyDirectory], rekeyDirectory)
	for _, tc := range []struct {
		name, stored string
		keys         []string
		want         string
	}{
		{"v2, the other key", v2New, []string{"--key-encryption-key", oldOnly},
			"is sealed under a key encryption key that is not in --key-encryption-key (key id " + newID + ")"},
		{"v2, from a file", v2New, []string{"--key-encryption-key-file", writeKeyFile(t, oldOnly+"\n")},
			"(key id " + newID + ")"},
		{"v2, no key", v2New, nil, "no --key-encryption-key is set (it names key id " + newID + ")"},
		{"v1, the other key", v1(t, b.newKey, b.plain[rekeyDirectory], rekeyDirectory), []string{"--key-encryption-key", oldOnly},
			"v1 format, which names no key id; tried key ids " + oldID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storeAccount(tc.stored)
			code, stdout, stderr := invoke(t, append([]string{"run", "--database-url", b.dsn,
				"--acme-directory", rekeyDirectory, "--http01-listen", "", "--admin-listen", ""}, tc.keys...)...)
			require.Equal(t, exitUsage, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, "certworker: cannot open the stored ACME account key of "+rekeyDirectory+": ")
			require.Contains(t, stderr, tc.want)
			require.Contains(t, stderr, "start with the key it was sealed with in --key-encryption-key")
			require.NotContains(t, stderr, oldOnly)
		})
	}
	var status string
	var attempts int
	var claimedBy *string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT ssl_status, ssl_attempts, ssl_claimed_by FROM proxy_domains WHERE id = $1`, id).
		Scan(&status, &attempts, &claimedBy))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
	require.Nil(t, claimedBy, "run claimed before it checked the account key")
}
