package certstore

import (
	"crypto/tls"
	"time"
)

// Misses is how many misses s remembers.
func Misses(s *Store) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.misses
}

// Epoch counts the notifications and reconnections s has seen, so that a test can
// wait for the notification of its own write before it counts queries.
func Epoch(s *Store) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.epoch
}

// Held is the certificate s holds for name and when it is next checked against the
// database: nil and the zero time when it holds none.
func Held(s *Store, name string) (*tls.Certificate, time.Time) {
	e := s.lookup(name)
	if e == nil || e.cert == nil {
		return nil, time.Time{}
	}
	return e.cert, e.freshUntil
}

// LoadSQL is the statement a load runs: $1 the name, $2 and $3 the version and
// domain held, $4 the wildcard above the name.
const LoadSQL = loadSQL
