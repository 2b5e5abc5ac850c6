package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// stuckIssuer is an issuer that does not return when cancelled, as a CA request cut
// off mid-flight may not: it waits for release, then reports whether it may still send
// the CA anything (its deactivation of the order's authorizations) by its deadline.
type stuckIssuer struct {
	started chan struct{}
	release chan struct{}
	checked chan error
}

func (s *stuckIssuer) Issue(_ context.Context, req issuing.Request) (*issuing.Certificate, error) {
	s.started <- struct{}{}
	<-s.release
	s.checked <- req.Deadline.Check()
	return nil, context.Canceled
}

// At shutdown an order that does not stop in time is handed back by the shutdown
// itself; from that moment it sends the CA nothing more: its deadline has passed, so
// no deactivation of its authorizations follows the hand-back (another instance may
// be ordering the name by then, and the CA reuses pending authorizations). The
// deadline still ran a full lease after the hand-back.
func TestWorker_AnOrderHandedBackAtShutdownSendsNothingAfterTheHandBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.domain(t, b.tenant(t))
	iss := &stuckIssuer{started: make(chan struct{}, 1), release: make(chan struct{}), checked: make(chan error, 1)}
	in := b.start(t, "w", worker.Config{Issuer: iss, Concurrency: 1, PollInterval: time.Second,
		ShutdownGrace: 100 * time.Millisecond})
	select {
	case <-iss.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the order did not start")
	}
	require.NoError(t, in.Stop(t, time.Minute))
	require.Equal(t, "pending", b.status(t, id), "the shutdown did not hand the claim back")
	close(iss.release)
	select {
	case err := <-iss.checked:
		require.ErrorIs(t, err, issuing.ErrLeaseDeadline, "the order could still send the CA requests after its hand-back")
	case <-time.After(30 * time.Second):
		t.Fatal("the issuer did not report")
	}
}
