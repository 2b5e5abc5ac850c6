package main

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore/seal"
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
