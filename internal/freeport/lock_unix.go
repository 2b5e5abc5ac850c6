//go:build unix

package freeport

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lock takes the lock file of port in dir without waiting; release gives it up.
// The kernel drops the lock when the process ends, however it ends.
func lock(dir string, port int) (release func(), ok bool) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return func() { _ = f.Close() }, true
}
