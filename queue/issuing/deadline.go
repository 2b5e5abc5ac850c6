package issuing

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrLeaseDeadline: the claim's local deadline has passed. The order sends the CA
// nothing more; the worker hands the claim back uncharged.
var ErrLeaseDeadline = errors.New("the claim's lease deadline has passed: nothing more is sent to the CA for this order")

// LeaseMargin is what a claim's local deadline keeps back from the lease: a
// twentieth, fifty times the clock drift NTP allows, to cover the delay between a
// check and a request leaving the host (docs/high-availability.md).
func LeaseMargin(lease time.Duration) time.Duration { return lease / 20 }

// Deadline is a claim's local deadline on this process's monotonic clock: the send
// time of the last confirmed lease renewal (or the claim) plus the lease, less
// LeaseMargin. Past it another instance may have reclaimed the row. It only moves
// forward; a nil *Deadline is none. Safe for concurrent use.
type Deadline struct {
	lease time.Duration
	life  time.Duration // lease minus margin

	mu sync.Mutex
	at time.Time // carries a monotonic reading: only time.Now() and Add make it

	// ended is cancelled by Expire: the deadline has passed whatever at says.
	ended  context.Context
	expire context.CancelFunc
}

// NewDeadline is the deadline of a claim whose statement was sent at sent.
func NewDeadline(sent time.Time, lease time.Duration) *Deadline {
	d := &Deadline{lease: lease, life: lease - LeaseMargin(lease)}
	d.at = sent.Add(d.life)
	d.ended, d.expire = context.WithCancel(context.Background())
	return d
}

// Expire ends the deadline for good. The shutdown calls it before handing an order
// back, so the order cannot then deactivate an authorization another order reuses.
func (d *Deadline) Expire() {
	if d == nil {
		return
	}
	d.mu.Lock()
	if now := time.Now(); now.Before(d.at) {
		d.at = now
	}
	d.mu.Unlock()
	d.expire()
}

// Renewed moves the deadline to a lease from sent; it never moves back.
func (d *Deadline) Renewed(sent time.Time) {
	at := sent.Add(d.life)
	d.mu.Lock()
	defer d.mu.Unlock()
	if at.After(d.at) && d.ended.Err() == nil {
		d.at = at
	}
}

// Lease is the lease the deadline runs on.
func (d *Deadline) Lease() time.Duration { return d.lease }

// At is the deadline now.
func (d *Deadline) At() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// Left is the time until the deadline (negative once passed), on the monotonic clock.
func (d *Deadline) Left() time.Duration { return time.Until(d.At()) }

// Check returns ErrLeaseDeadline once the deadline has passed (never for nil).
func (d *Deadline) Check() error {
	if d == nil || d.Left() > 0 && d.ended.Err() == nil {
		return nil
	}
	return ErrLeaseDeadline
}

// Bound is ctx, ending with cause ErrLeaseDeadline at the deadline as renewals move
// it; ctx itself for a nil Deadline.
func (d *Deadline) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d == nil {
		return context.WithCancel(ctx)
	}
	bounded, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex // guards t and done against the timer's own goroutine
	var t *time.Timer
	done := false
	check := func() {
		left := d.Left()
		mu.Lock()
		defer mu.Unlock()
		switch {
		case done:
		case left > 0:
			t.Reset(left) // renewed since the timer was set
		default:
			cancel(ErrLeaseDeadline)
		}
	}
	mu.Lock()
	t = time.AfterFunc(d.Left(), check)
	mu.Unlock()
	stopExpired := context.AfterFunc(d.ended, func() { cancel(ErrLeaseDeadline) })
	return bounded, func() {
		mu.Lock()
		done = true
		t.Stop()
		mu.Unlock()
		stopExpired()
		cancel(context.Canceled)
	}
}
