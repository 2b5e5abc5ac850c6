package listener

import (
	"context"
	"fmt"
)

// Waker is a source of wake-ups for the worker: Listener (NOTIFY) or Logical
// (logical replication). Every implementation MUST:
//   - connect in Start and return its error, leaving nothing running; then keep
//     reconnecting until Stop or the end of Start's context;
//   - send a SourceReconnect wake-up once every later commit will wake it;
//   - never block on the consumer: Wakes has a buffer of one and merges;
//   - make Stop safe before Start, twice and concurrently, returning once nothing runs;
//   - be safe for concurrent use.
type Waker interface {
	// Start connects and backgrounds the waker.
	Start(ctx context.Context) error
	// Stop ends it and waits until it has ended.
	Stop()
	// Wakes is where wake-ups arrive. It is never closed.
	Wakes() <-chan Wake
	// Connected reports whether the waker will see the next change (/readyz).
	Connected() bool
}

var (
	_ Waker     = (*Listener)(nil)
	_ Waker     = (*Logical)(nil)
	_ Announcer = (*Logical)(nil)
)

// Announcer is a Waker whose wake-up can arrive before a new snapshot sees the commit
// it announces: a logically decoded commit is flushed to WAL, and streamed, a moment
// before its transaction leaves the server's list of running ones (longer under CPU
// contention, and for as long as a synchronous standby has not answered). A NOTIFY is
// delivered only after that, so Listener is not one.
type Announcer interface {
	// Announced takes the transaction ids (32-bit, as the stream gives them) of the
	// claimable commits announced since the last call, oldest first.
	Announced() []uint32
}

// SetupError says that the server cannot do what --wake logical needs, and which
// setting to change, in one line for the operator.
type SetupError struct {
	msg string
}

func (e *SetupError) Error() string { return e.msg }

func setupErrorf(format string, args ...any) *SetupError {
	return &SetupError{msg: "--wake logical: " + fmt.Sprintf(format, args...)}
}
