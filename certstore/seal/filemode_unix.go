//go:build unix

package seal

import (
	"fmt"
	"os"
	"syscall"
)

// checkKeyFileMode refuses a key file that others than its reader may read, by the
// rule PostgreSQL applies to its own TLS key file (be-secure-common.c,
// check_ssl_key_file_permissions): owned by the user certworker runs as, it may be
// readable by that user only (0600 or less); owned by root, by its group too (0640
// or less), which is how Kubernetes mounts a Secret (root:fsGroup, defaultMode
// 0440) and how an operator shares one file between services. Any other owner, or a
// file others may read or anyone but its owner may write, is refused: a key that
// opens every stored private key must not be one a shell account on the host can
// copy. fi is the file as opened, so a symlink (a Secret's ..data link) is judged by
// the file it leads to.
func checkKeyFileMode(name string, fi os.FileInfo) error {
	return keyFileModeFor(name, fi, uint32(os.Geteuid()))
}

// keyFileModeFor is checkKeyFileMode for a reader whose effective uid is euid.
func keyFileModeFor(name string, fi os.FileInfo, euid uint32) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == euid && perm&0o077 != 0:
		return fmt.Errorf("%s: mode %04o lets others than its owner read or write it; "+
			"it must be 0600 or less (chmod 0600), or owned by root with 0640 or less", name, perm)
	case st.Uid == 0 && st.Uid != euid && perm&0o037 != 0:
		return fmt.Errorf("%s: mode %04o, owned by root, lets others than root and its group read it, "+
			"or its group write it; it must be 0640 or less", name, perm)
	case st.Uid != euid && st.Uid != 0:
		return fmt.Errorf("%s: owned by uid %d, neither the user certworker runs as (uid %d) nor root; "+
			"chown it to one of them, with mode 0600 (or 0640 for root)", name, st.Uid, euid)
	}
	return nil
}
