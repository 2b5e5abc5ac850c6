package certstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"

	"github.com/certworker/certworker/certstore/seal"
)

// Channel is the notification channel of migration 00007's triggers; the payload is
// a domain name in lower case. Proxies written in other languages listen on the same
// channel (docs/proxy-integration.md), so the name never changes.
const Channel = "certworker_certificate"

// Defaults for Options; each says what it costs and what it buys.
const (
	// DefaultTTL bounds how long a change that no trigger saw (a TRUNCATE, a write
	// with triggers disabled, a restore) goes unnoticed; every other change is
	// notified. Past it an entry is served once more while it is checked in the
	// background: one index probe that transfers no certificate when the version
	// is unchanged, so 100,000 cached names cost about 170 small queries a second.
	DefaultTTL = 10 * time.Minute
	// DefaultMissTTL is how long "no certificate for this name" is remembered. A
	// flood of handshakes for one unknown name costs one query per 5 s; a
	// certificate stored meanwhile is notified and served at once regardless.
	DefaultMissTTL = 5 * time.Second
	// DefaultLoadTimeout bounds one load from the database. A handshake gives up
	// waiting sooner if its own context ends.
	DefaultLoadTimeout = 5 * time.Second
	// DefaultMaxLoads is how many loads may hold a pool connection at once, so a
	// flood of distinct unknown names takes 4 of the pool's connections, not all of
	// them. A load is one index probe, about a millisecond: 4 serve thousands of
	// new names a second.
	DefaultMaxLoads = 4
	// DefaultMaxMisses caps the remembered misses (about 100 bytes each), so random
	// names cannot grow the cache without bound.
	DefaultMaxMisses = 100_000
	// DefaultPingAfter and DefaultPingTimeout: a silent LISTEN connection is
	// checked after 10 s and declared lost when the check takes 5 s, so a half-open
	// connection is found within 15 s (as package listener does).
	DefaultPingAfter   = 10 * time.Second
	DefaultPingTimeout = 5 * time.Second
	// DefaultBackoffMin and DefaultBackoffMax: reconnection delays, doubled per
	// failure and drawn from their upper half. A restarted server is listened to
	// again within about 100 ms; one down for an hour within 30 s of its return.
	DefaultBackoffMin = 100 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// unavailableRetry is how long a name whose load failed for want of the database is
// not loaded again: what is cached is served meanwhile, and a flood of handshakes
// during an outage costs one connection attempt per name per second.
const unavailableRetry = time.Second

// Errors GetCertificate returns, so that a server can log why a handshake failed.
// Whatever the reason, no certificate is presented: never another name's, never a
// default one.
var (
	// ErrNoServerName: the client sent no server name (SNI), or one that is not a
	// domain name (an IP address, a malformed name). No query is made.
	ErrNoServerName = errors.New("certstore: no usable server name (SNI) in the client hello")
	// ErrUnknownName: no domain row has that name.
	ErrUnknownName = errors.New("certstore: no domain by that name")
	// ErrNotVerified: the domain row is not verified.
	ErrNotVerified = errors.New("certstore: the domain is not verified")
	// ErrNoCertificate: the domain has no stored certificate.
	ErrNoCertificate = errors.New("certstore: no certificate stored for the domain")
	// ErrUnusable: a certificate is stored but cannot be served: expired or not yet
	// valid, not for this name, unparsable, or its key does not open (the wrapped
	// error says which; the key is never in it).
	ErrUnusable = errors.New("certstore: the stored certificate cannot be served")
	// ErrUnavailable: the database could not be asked and nothing is cached.
	ErrUnavailable = errors.New("certstore: the database is unavailable and nothing is cached for the name")
)

// Options tunes a Store. The zero value is the production setting, with no key
// encryption keys (every stored key must be PEM) and no logs.
type Options struct {
	// KeyEncryptionKeys open sealed keys: certworker's --key-encryption-key, the
	// same list (seal.ParseKeyring reads the flag's form). Any of them opens.
	KeyEncryptionKeys seal.Keyring
	// Logger receives the store's logs, under the name "certstore". nil: none.
	Logger *zap.Logger
	// TTL, MissTTL, LoadTimeout, MaxLoads, MaxMisses, PingAfter, PingTimeout,
	// BackoffMin and BackoffMax: 0 means the Default of the same name.
	TTL         time.Duration
	MissTTL     time.Duration
	LoadTimeout time.Duration
	MaxLoads    int
	MaxMisses   int
	PingAfter   time.Duration
	PingTimeout time.Duration
	BackoffMin  time.Duration
	BackoffMax  time.Duration
}

func (o Options) withDefaults() Options {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&o.TTL, DefaultTTL)
	set(&o.MissTTL, DefaultMissTTL)
	set(&o.LoadTimeout, DefaultLoadTimeout)
	set(&o.PingAfter, DefaultPingAfter)
	set(&o.PingTimeout, DefaultPingTimeout)
	set(&o.BackoffMin, DefaultBackoffMin)
	set(&o.BackoffMax, max(DefaultBackoffMax, o.BackoffMin))
	if o.MaxLoads <= 0 {
		o.MaxLoads = DefaultMaxLoads
	}
	if o.MaxMisses <= 0 {
		o.MaxMisses = DefaultMaxMisses
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Store serves the certificates certworker stores, to a crypto/tls server through
// GetCertificate. Its methods are safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	opts Options
	log  *zap.Logger

	cache
	// loads joins the handshakes waiting for the same name into one query.
	loads singleflight.Group
	// loadSlots holds a token per load in progress (at most MaxLoads).
	loadSlots chan struct{}
	// refreshes are names to load in the background (notified, or past their TTL).
	// Sends never block: a name that does not fit is loaded by its next handshake.
	refreshes chan string

	connected atomic.Bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// refreshers is how many goroutines work through the background refreshes. Two keep
// a notified name loading while another waits on a slow query, and leave the other
// load slots to handshakes.
const refreshers = 2

// Open returns a Store reading through pool, listening on Channel on a connection of
// its own. It connects before it returns, so a database that cannot be reached is an
// error here rather than a store that serves nothing; after that the store
// reconnects on its own and keeps serving what it holds. Close releases it.
func Open(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if err := opts.KeyEncryptionKeys.Validate(); err != nil {
		return nil, fmt.Errorf("certstore: %w", err)
	}
	s := &Store{
		pool:      pool,
		opts:      opts,
		log:       opts.Logger.Named("certstore"),
		cache:     newCache(opts.MaxMisses),
		loadSlots: make(chan struct{}, opts.MaxLoads),
		refreshes: make(chan string, 1024),
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("certstore: %w", err)
	}
	s.connected.Store(true)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.wg.Add(1 + refreshers)
	go s.keepListening(runCtx, conn)
	for range refreshers {
		go s.refreshLoop(runCtx)
	}
	s.log.Info("certificate store open", zap.String("channel", Channel),
		zap.Int("key_encryption_keys", len(opts.KeyEncryptionKeys)))
	return s, nil
}

// Close stops listening and waits for the store's goroutines. It is safe twice. What
// is cached stays readable, and a handshake after Close still loads through the pool
// while the pool is open, but nothing is reloaded when it changes.
func (s *Store) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		s.wg.Wait()
	})
}

// Connected reports whether the store is listening for changes now. While it is not,
// it serves what it holds and reconnects; a readiness check may want to know.
func (s *Store) Connected() bool { return s.connected.Load() }

// GetCertificate is tls.Config.GetCertificate: the certificate stored for the
// client's server name, from memory when it is there and current, otherwise loaded
// (one query, shared by every handshake waiting for the same name). A name it cannot
// serve gets an error (one of the Err values above, wrapped), never another
// certificate.
func (s *Store) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name, ok := serverName(hello.ServerName)
	if !ok {
		return nil, ErrNoServerName
	}
	now := time.Now()
	e := s.lookup(name)
	switch {
	case e == nil, e.outdated():
	case e.servable(now):
		if now.After(e.freshUntil) {
			s.refreshSoon(name)
		}
		return e.cert, nil
	case e.cert == nil && e.miss != nil && now.Before(e.freshUntil):
		return nil, e.miss
	}
	if e != nil && e.servable(now) && now.Before(e.retryAt) {
		// Outdated, but the database just failed to answer for it: serve what we
		// have rather than make every handshake wait on an outage.
		return e.cert, nil
	}
	ctx := hello.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return s.loadFor(ctx, name, e)
}

// loadFor waits for name's load, started now or already under way. A handshake that
// gives up waiting gets what is cached, if it can be served.
func (s *Store) loadFor(ctx context.Context, name string, cached *entry) (*tls.Certificate, error) {
	ch := s.loads.DoChan(name, func() (any, error) { return s.load(name), nil })
	select {
	case r := <-ch:
		e := r.Val.(*entry)
		if e.cert != nil {
			return e.cert, nil
		}
		return nil, e.miss
	case <-ctx.Done():
		if cached != nil && cached.servable(time.Now()) {
			return cached.cert, nil
		}
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
}

// refreshSoon asks for name to be loaded in the background, unless the queue is
// full: then its next handshake loads it.
func (s *Store) refreshSoon(name string) {
	select {
	case s.refreshes <- name:
	default:
	}
}

func (s *Store) refreshLoop(ctx context.Context) {
	defer s.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-s.refreshes:
			_, _, _ = s.loads.Do(name, func() (any, error) { return s.load(name), nil })
		}
	}
}

// serverName is the name a client asked for, in lower case and without a trailing
// dot, if it can be a domain name: at most 253 characters, labels of 1 to 63 letters,
// digits, hyphens or underscores, and at least two of them. Anything else (no SNI,
// an address, binary junk) is refused without a query.
func serverName(sni string) (string, bool) {
	name := strings.ToLower(strings.TrimSuffix(sni, "."))
	if len(name) == 0 || len(name) > 253 || !strings.Contains(name, ".") {
		return "", false
	}
	label := 0
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if label == 0 {
				return "", false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return "", false
		}
		if label++; label > 63 {
			return "", false
		}
	}
	return name, label > 0
}
