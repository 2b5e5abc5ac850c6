package listener

import (
	"context"
	"sync"
)

// lifecycle is Start and Stop for a wake source that keeps a connection up in a goroutine.
type lifecycle struct {
	// mu guards cancel and done, and serialises Start against Stop.
	mu sync.Mutex
	// cancel stops the goroutine and done is closed when it ends; both nil when none runs.
	cancel context.CancelFunc
	done   chan struct{}
}

// start makes the first connection with open, under the lock, then runs what open
// returns in a goroutine on a child of ctx that stop cancels. If open fails nothing
// runs; ErrStarted if a goroutine runs already. run must close done.
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

// stop ends the goroutine and waits for it, also for a start still connecting.
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
