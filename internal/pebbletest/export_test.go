package pebbletest

import "os"

// LookupEnvLocked reads the environment under Start's lock, so that a test running
// in parallel with another's Start does not see the variables Start sets for the
// moment it builds Pebble.
func LookupEnvLocked(key string) (string, bool) {
	envMu.Lock()
	defer envMu.Unlock()
	return os.LookupEnv(key)
}
