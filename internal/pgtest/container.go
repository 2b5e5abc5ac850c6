package pgtest

import "context"

// StartContainer starts a PostgreSQL container outside a test (for the demo), from
// the same image setting as the tests. Terminate removes it.
func StartContainer(ctx context.Context) (*Server, error) {
	setContainerEnv()
	return startContainer(ctx, nil)
}

// Terminate stops and removes the server's container, if it has one.
func (s *Server) Terminate(ctx context.Context) error {
	if s.container == nil {
		return nil
	}
	return s.container.Terminate(ctx)
}
