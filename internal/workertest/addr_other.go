//go:build !unix

package workertest

// lockPort cannot lock across processes here, so FreeAddr falls back to a port the
// kernel picks.
func lockPort(string, int) (func(), bool) { return nil, false }
