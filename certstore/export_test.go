package certstore

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
