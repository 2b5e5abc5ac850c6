package worker

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// Defaults of Config, the `certworker run` flags'.
const (
	// DefaultConcurrency is the number of orders in flight on one instance.
	DefaultConcurrency = 4
	// DefaultPollInterval is the safety-net pass, and the longest either timer is set for.
	DefaultPollInterval = 30 * time.Second
	// DefaultShutdownGrace is what orders in flight get to finish after SIGTERM; what
	// is still running then is handed back.
	DefaultShutdownGrace = 30 * time.Second
	// DefaultOrderTimeout bounds one order: Let's Encrypt issues in seconds, and a hung
	// order would otherwise hold its slot and lease for ever.
	DefaultOrderTimeout = 10 * time.Minute
)

// Config is everything a running worker needs. New fills in the defaults.
type Config struct {
	// Pool is the database; the wake source connects with its configuration.
	Pool *pgxpool.Pool
	// DB, if set, runs the worker's statements instead of Pool, for tests that make
	// the database fail in chosen ways.
	DB queue.DB
	// Issuer places the orders (acme.Issuer; a fake in tests about the queue).
	Issuer issuing.Issuer
	// Log receives the worker's logs (named "worker") and the wake source's.
	Log *zap.Logger
	// Registerer, if not nil, receives the worker's and the wake source's metrics.
	Registerer prometheus.Registerer

	// Wake is the wake source: issuing.WakeNotify (the default) or issuing.WakeLogical.
	Wake string
	// WakeOptions tune the wake source (reconnection backoff, pings).
	WakeOptions listener.Options
	// Topics are other channels' consumers (acme.Responder on acme.TokenChannel),
	// carried by the wake source's listening connection, or their own with --wake
	// logical. Each is told of every (re)connection.
	Topics map[string]listener.Topic

	// Owner names this instance in ssl_claimed_by and logs (default host:pid); a random
	// suffix is added.
	Owner string
	// Directory is the ACME directory URL, the key of the CA's pauses and ledger.
	Directory string
	// Wildcards makes "*" a valid first label (issuing.CheckNameFor), with --dns01-zone.
	Wildcards bool
	// Queue is the backoff curve, the attempt limit and the lease.
	Queue issuing.Config
	// Limits are the ledger's; the zero value turns every limit off.
	Limits issuing.Limits
	// Fallback is the second CA, nil for none (fallback.go).
	Fallback *FallbackCA
	// CAA, if set, says before each order which CAs a name's CAA records allow.
	CAA CAAFunc

	// Concurrency is the number of orders in flight on this instance.
	Concurrency int
	// PollInterval is the safety-net pass, and the longest a timer is set for.
	PollInterval time.Duration
	// ShutdownGrace is what orders in flight get to finish once the context ends.
	ShutdownGrace time.Duration
	// OrderTimeout bounds one order; one that runs past it is cancelled and charged.
	OrderTimeout time.Duration
	// RenewalInfoPerSecond is the fleet's renewal-information requests a second to the
	// CA at Directory (--ari-requests-per-second).
	RenewalInfoPerSecond float64
	// DNSWaitMax is how long a domain may wait for its DNS before it fails.
	DNSWaitMax time.Duration
	// DNSWait is the pace of the checks of domains waiting for their DNS; the zero
	// value is the defaults (dnswait.go), which tests shorten.
	DNSWait DNSWaitPace
}

// DNSWaitPace is the waiter's pace (dnswait.go); a zero field takes its default.
type DNSWaitPace struct {
	// Tick is how often the waiter looks for due checks when no slot has freed.
	Tick time.Duration
	// Parallel is the checks running at once on this instance, Share those of one
	// tenant.
	Parallel, Share int
	// CheckTimeout bounds one check, whatever the tenant's DNS and web server do.
	CheckTimeout time.Duration
	// First is the gap between two checks in a wait's first hour and after a TLS
	// handshake for the name (queue.WaitCheckFirst).
	First time.Duration
}

// DefaultDNSWaitMax is --dns-wait-max's default: a week covers a tenant verifying
// before a planned move, and then a name whose DNS never came stops being checked.
const DefaultDNSWaitMax = 7 * 24 * time.Hour

func (c Config) withDefaults() (Config, error) {
	switch {
	case c.Pool == nil:
		return c, errors.New("worker: no database pool")
	case c.Issuer == nil:
		return c, errors.New("worker: no issuer")
	case c.Directory == "":
		return c, errors.New("worker: no ACME directory (the key of the CA's pauses)")
	case c.Concurrency < 0, c.PollInterval < 0, c.ShutdownGrace < 0, c.OrderTimeout < 0:
		return c, errors.New("worker: negative concurrency or duration")
	case c.RenewalInfoPerSecond < 0, math.IsNaN(c.RenewalInfoPerSecond), math.IsInf(c.RenewalInfoPerSecond, 0):
		return c, fmt.Errorf("worker: renewal-information rate %v: %w", c.RenewalInfoPerSecond, issuing.ErrBadRate)
	}
	if f := c.Fallback; f != nil {
		switch {
		case f.Issuer == nil:
			return c, errors.New("worker: a second CA without an issuer")
		case f.Directory == "":
			return c, errors.New("worker: a second CA without an ACME directory")
		case f.Directory == c.Directory:
			return c, errors.New("worker: the second CA's ACME directory is the first's")
		case f.After < 0:
			return c, errors.New("worker: negative --acme-fallback-after")
		}
		if f.After == 0 {
			f2 := *f
			f2.After = issuing.DefaultFallbackAfter
			c.Fallback = &f2
		}
		c.Queue.Fallback = &issuing.Fallback{Directory: c.Fallback.Directory, After: c.Fallback.After}
	}
	if c.RenewalInfoPerSecond == 0 {
		c.RenewalInfoPerSecond = issuing.DefaultRenewalInfoPerSecond
	}
	if c.DNSWaitMax <= 0 {
		c.DNSWaitMax = DefaultDNSWaitMax
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.Wake == "" {
		c.Wake = issuing.WakeNotify
	}
	if c.Wake != issuing.WakeNotify && c.Wake != issuing.WakeLogical {
		return c, fmt.Errorf("worker: wake source %q is neither %s nor %s", c.Wake, issuing.WakeNotify, issuing.WakeLogical)
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	c.Queue = c.Queue.WithDefaults()
	set := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	set(&c.DNSWait.Tick, dnsWaitTick)
	set(&c.DNSWait.CheckTimeout, dnsCheckTimeout)
	set(&c.DNSWait.First, queue.WaitCheckFirst)
	if c.DNSWait.Parallel <= 0 {
		c.DNSWait.Parallel = dnsWaitParallel
	}
	if c.DNSWait.Share <= 0 {
		c.DNSWait.Share = min(dnsWaitShare, c.DNSWait.Parallel)
	}
	set(&c.PollInterval, DefaultPollInterval)
	set(&c.ShutdownGrace, DefaultShutdownGrace)
	set(&c.OrderTimeout, DefaultOrderTimeout)
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	return c, nil
}
