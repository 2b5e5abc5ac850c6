//go:build unix

package seal

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The key file's owner and mode, by PostgreSQL's rule for its key file: the reader's
// own file 0600 or less, root's 0640 or less (a Kubernetes Secret: root, fsGroup,
// 0440), no other owner; a symlink is judged by the file it leads to. Guards against
// a key that opens every stored private key being readable by any account on the
// host (the compose instructions of old wrote it 0644).
func TestKeyFileMode(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := t.TempDir()
	file := func(name string, uid int, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte("x"), 0o600))
		require.NoError(t, os.Chown(path, uid, uid))
		require.NoError(t, os.Chmod(path, mode))
		return path
	}
	const worker = 65532
	for _, tc := range []struct {
		name string
		path string
		euid uint32
		want string // "" passes
	}{
		{"own, 0600", file("own600", worker, 0o600), worker, ""},
		{"own, 0400", file("own400", worker, 0o400), worker, ""},
		{"own, 0640", file("own640", worker, 0o640), worker, "mode 0640 lets others than its owner read or write it"},
		{"own, 0644", file("own644", worker, 0o644), worker, "mode 0644 lets others"},
		{"root's, 0440 (a Kubernetes Secret)", file("root440", 0, 0o440), worker, ""},
		{"root's, 0640", file("root640", 0, 0o640), worker, ""},
		{"root's, 0644", file("root644", 0, 0o644), worker, "mode 0644, owned by root, lets others"},
		{"root's, 0660", file("root660", 0, 0o660), worker, "mode 0660, owned by root"},
		{"another user's, 0444", file("other444", 1000, 0o444), worker, "owned by uid 1000, neither the user certworker runs as (uid 65532) nor root"},
		{"running as root, root's 0640", file("rootroot640", 0, 0o640), 0, "mode 0640 lets others than its owner"},
	} {
		f, err := os.Open(tc.path)
		require.NoError(t, err)
		fi, err := f.Stat()
		require.NoError(t, err)
		require.NoError(t, f.Close())
		err = keyFileModeFor("--key-encryption-key-file "+tc.path, fi, tc.euid)
		if tc.want == "" {
			require.NoError(t, err, tc.name)
			continue
		}
		require.ErrorContains(t, err, "--key-encryption-key-file "+tc.path+": ", tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}

	// ReadKeyringFile follows a symlink (itself 0777) to the file, and judges that.
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
	target := filepath.Join(dir, "kek")
	require.NoError(t, os.WriteFile(target, []byte(key+"\n"), 0o600))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(target, link))
	_, err := ReadKeyringFile(link)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(target, 0o644))
	_, err = ReadKeyringFile(link)
	require.ErrorContains(t, err, "--key-encryption-key-file "+link+": mode 0644")
}
