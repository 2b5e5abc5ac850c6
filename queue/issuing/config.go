package issuing

import "time"

// Defaults, the reference worker's values.
const (
	// DefaultRetryBase is the first gap between attempts, doubled on each failure.
	DefaultRetryBase = time.Minute
	// DefaultRetryMax is the longest gap. The cap matters more than the growth: past
	// a point the failure is a human problem, and hammering the CA for a domain that
	// will never validate spends a rate limit the domains that would validate share.
	DefaultRetryMax = 4 * time.Hour
	// DefaultMaxAttempts: the usual cause of failure is DNS never pointed at the
	// proxy, which no amount of retrying fixes. Ten attempts span about a day.
	DefaultMaxAttempts = 10
	// DefaultLease is how long a claim stays valid without being renewed. The
	// running instance renews it every third of this, so a live order survives two
	// missed renewals; a killed instance's claim is reclaimed within it, well inside
	// the 2 minutes a failover may take (docs/high-availability.md).
	DefaultLease = 60 * time.Second
)

// Config is the backoff curve, the give-up point and the lease. The claim query takes
// these as parameters, so the Go and SQL curves cannot drift.
type Config struct {
	RetryBase   time.Duration
	RetryMax    time.Duration
	MaxAttempts int
	Lease       time.Duration
	// Fallback is the second CA, nil for none: the claim then decides, for each row,
	// which CA its order goes to (fallback.go).
	Fallback *Fallback
}

// DefaultConfig is the reference worker's curve.
func DefaultConfig() Config {
	return Config{
		RetryBase:   DefaultRetryBase,
		RetryMax:    DefaultRetryMax,
		MaxAttempts: DefaultMaxAttempts,
		Lease:       DefaultLease,
	}
}

// WithDefaults is c with every unset field at its default.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.RetryBase <= 0 {
		c.RetryBase = d.RetryBase
	}
	if c.RetryMax <= 0 {
		c.RetryMax = d.RetryMax
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.Lease <= 0 {
		c.Lease = d.Lease
	}
	return c
}

// MaxShift bounds the exponent in both curves. It only keeps the arithmetic in
// range; it is far above the point where the cap binds for any sensible base (the
// reference clamped at 12, and an earlier version of it at 8, which held the value
// below the cap and made the cap dead code).
const MaxShift = 62

// Backoff is how long a domain waits after its nth consecutive failure:
// base * 2^n, capped at max. Negative counts (a hand-edited row) count as 0.
// The claim query computes the same curve in SQL from the same parameters.
func (c Config) Backoff(attempts int) time.Duration {
	c = c.WithDefaults()
	n := min(max(attempts, 0), MaxShift)
	d := c.RetryBase
	for range n {
		if d >= c.RetryMax || d > c.RetryMax/2 {
			return c.RetryMax
		}
		d *= 2
	}
	return min(d, c.RetryMax)
}
