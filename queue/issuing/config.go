package issuing

import "time"

// Defaults, the Rust worker's values.
const (
	// DefaultRetryBase is the first gap between attempts, doubled on each failure.
	DefaultRetryBase = time.Minute
	// DefaultRetryMax is the longest gap: past a point the failure is a human problem,
	// and retrying spends a rate limit the other domains share.
	DefaultRetryMax = 4 * time.Hour
	// DefaultMaxAttempts: the usual failure, DNS not pointed at the proxy, is not fixed
	// by retrying. Ten attempts span about a day.
	DefaultMaxAttempts = 10
	// DefaultLease is how long a claim stays valid without renewal. Renewed every third
	// of it, a live order survives two missed renewals; a killed instance's claim is
	// reclaimed within it (docs/high-availability.md).
	DefaultLease = 60 * time.Second
)

// Config is the backoff curve, the give-up point and the lease. The claim query takes
// them as parameters, so the Go and SQL curves cannot drift.
type Config struct {
	RetryBase   time.Duration
	RetryMax    time.Duration
	MaxAttempts int
	Lease       time.Duration
	// Fallback is the second CA, nil for none (fallback.go).
	Fallback *Fallback
}

// DefaultConfig is the default curve.
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

// MaxShift bounds the exponent in both curves, only to keep the arithmetic in range:
// far above where the cap binds.
const MaxShift = 62

// Backoff is how long a domain waits after its nth consecutive failure: base * 2^n,
// capped at max; negative counts as 0. backoffSQL computes the same in SQL.
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
