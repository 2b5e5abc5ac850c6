package listener

import (
	"context"
	"sync"
)

// lifecycle is Start and Stop for a wake source that keeps one connection up in a
// goroutine: the NOTIFY Listener and the logical waker embed it.
type lifecycle struct {
	// mu guards cancel and done, and serialises Start against Stop.
	mu sync.Mutex
	// cancel stops the running goroutine; done is closed when it has finished. Both
	// nil before the first Start and after a Stop.
	cancel context.CancelFunc
	done   chan struct{}
}

// start makes the first connection with open, under the lock, and runs what open
// returns in a goroutine with a child of ctx, which outlives start's call but not
// ctx (the process's lifetime in cmd/certworker) and which stop cancels. open's
// error is returned as it is, and then nothing is left running; ErrStarted if a
// goroutine is already running. run must close done when it returns.
func (lc *lifecycle) start(ctx context.Context, open func() (run func(ctx context.Context, done chan struct{}), err error)) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.done != nil {
		select {
		case <-lc.done:
			// Ended by its context; it may be started again.
		default:
			return ErrStarted
		}
	}
	run, err := open()
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	lc.cancel, lc.done = cancel, done
	go run(runCtx, done)
	return nil
}

// stop ends the goroutine and waits until it has finished, with Waker.Stop's
// guarantees; a stop that comes while start is connecting waits for that attempt
// (at most Options.ConnectTimeout).
func (lc *lifecycle) stop() {
	lc.mu.Lock()
	cancel, done := lc.cancel, lc.done
	lc.mu.Unlock()
	if done == nil {
		return
	}
	cancel()
	<-done
	lc.mu.Lock()
	if lc.done == done {
		lc.cancel, lc.done = nil, nil
	}
	lc.mu.Unlock()
}
