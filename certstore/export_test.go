package certstore

// Misses is how many misses s remembers.
func Misses(s *Store) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.misses
}
