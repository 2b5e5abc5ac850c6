package pgtest

import "context"

// StartContainer starts a PostgreSQL container outside a test (for the demo), from
// the same image setting as the tests. Terminate removes it.
func StartContainer(ctx context.Context) (*Server, error) {
	setContainerEnv()
	return startContainer(ctx, nil)
}

// Existing is a server started elsewhere (the primary of an internal/pgha pair), as
// a superuser's URL, with the migrated template created on it if it has none:
// NewDatabase then clones it.
func Existing(ctx context.Context, adminURL string) (*Server, error) {
	s := &Server{AdminURL: adminURL}
	if err := s.createTemplate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Terminate stops and removes the server's container, if it has one.
func (s *Server) Terminate(ctx context.Context) error {
	if s.container == nil {
		return nil
	}
	return s.container.Terminate(ctx)
}
