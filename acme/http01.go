package acme

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/go-acme/lego/v4/challenge/http01"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
)

const (
	// tokenTTL is how long a stored HTTP-01 token is served. It only matters for a
	// token whose instance died before cleaning it up: a live order deletes its token
	// as soon as the CA has decided. An hour is far beyond any validation (Let's
	// Encrypt validates within seconds; Pebble with its sleep, within 5 s) and still
	// ends the life of a dead order's token the same hour.
	tokenTTL = time.Hour

	// tokenWriteTimeout bounds Present and CleanUp, which lego calls without a
	// context.
	tokenWriteTimeout = 10 * time.Second
)

// tokenStore is the lego HTTP-01 provider of one order: Present stores the token in
// PostgreSQL, where the responder of every instance (Responder) finds it, and
// CleanUp deletes it. The table's trigger (migration 00008) tells every responder.
//
// Writes are fenced by the order's claim (migration 00011): a token row records the
// claim that wrote it, Present writes only while that claim is held (its token on a
// 'provisioning' row with an unexpired lease), and CleanUp deletes only its own
// claim's row. Two orders for one name can share a token: a CA reuses a pending
// authorization for the same account and name (Let's Encrypt does), so the order of
// an instance that was cut off and the order of the instance that reclaimed the
// domain answer the same challenge. Unfenced, the stale order's clean-up deleted the
// token the live order's validation needed, and its late Present overwrote it.
type tokenStore struct {
	pool *pgxpool.Pool
	log  *zap.Logger
	// ctx is the order's: an order cancelled before its token is stored stores
	// nothing. CleanUp runs even so.
	ctx context.Context
	// claim is the order's claim token (issuing.Request.ClaimToken), or "" for an
	// order outside the worker, whose writes are not fenced.
	claim string
	// presented is set once a token has been stored: lego got as far as the
	// challenge.
	presented atomic.Bool
}

// presentSQL stores a token ($1, $2 key authorization, $3 domain, $4 seconds to
// live) for claim $5, and deletes expired tokens (of orders whose instance died) in
// the same statement. With a claim it returns a row only while the claim is held:
// FOR SHARE reads the domain's row as it stands, not as the statement's snapshot had
// it (a reclaim that committed meanwhile is seen), and holds off a reclaim until the
// token is written; it conflicts with the proxy's writes to that one row for the
// length of this statement only. The upsert may take over a row another claim
// wrote: while this claim holds the domain, no other claim on it is live.
func presentSQL(fenced bool) string {
	return `
WITH held AS (
    ` + heldSQL(fenced, 5) + `
), expired AS (
    DELETE FROM certworker_http01_tokens WHERE expires_at < now()
)
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at, claim_token)
SELECT $1, $2, $3, now() + $4 * interval '1 second', held.claim FROM held
ON CONFLICT (token) DO UPDATE
    SET key_authorization = EXCLUDED.key_authorization,
        domain = EXCLUDED.domain,
        expires_at = EXCLUDED.expires_at,
        claim_token = EXCLUDED.claim_token
RETURNING 1`
}

// heldSQL selects the claim a fenced write is made under, parameter $n, as one row
// only while that claim is held (presentSQL says why FOR SHARE); unfenced, one row
// with a NULL claim.
func heldSQL(fenced bool, n int) string {
	if !fenced {
		return `SELECT NULL::uuid AS claim`
	}
	return fmt.Sprintf(`SELECT ssl_claim_token AS claim FROM proxy_domains
    WHERE ssl_claim_token = $%d::uuid AND ssl_status = 'provisioning' AND ssl_lease_expires_at > now()
    FOR SHARE`, n)
}

// Present stores the token, and returns once the row is committed: lego tells the
// CA to validate only after Present returns, and the CA may reach any instance. It
// stores nothing, and returns an error wrapping issuing.ErrLeaseDeadline, when the
// order's claim is no longer held.
func (s *tokenStore) Present(domain, token, keyAuth string) error {
	ctx, cancel := context.WithTimeout(s.ctx, tokenWriteTimeout)
	defer cancel()
	args := []any{token, keyAuth, domain, int64(tokenTTL / time.Second)}
	if err := writeFenced(ctx, s.pool, presentSQL(s.claim != ""), s.claim, args, "store HTTP-01 token"); err != nil {
		return err
	}
	s.presented.Store(true)
	return nil
}

// writeFenced runs a fenced write (presentSQL's shape), with the claim as the last
// argument when there is one. No row means the claim is no longer held: an error
// wrapping issuing.ErrLeaseDeadline. What the row holds is not read.
func writeFenced(ctx context.Context, pool *pgxpool.Pool, sql, claim string, args []any, what string) error {
	if claim != "" {
		args = append(args, claim)
	}
	var returned any
	err := pool.QueryRow(ctx, sql, args...).Scan(&returned)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: the order's claim is no longer held: %w", what, issuing.ErrLeaseDeadline)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// CleanUp deletes the token, if this order's claim wrote it: a row another claim has
// taken over since belongs to a live order. It runs after the order's context may
// have been cancelled (the worker gave the order up), so it uses its own deadline.
func (s *tokenStore) CleanUp(domain, token, _ string) error {
	return deleteFenced(s.ctx, s.pool, s.log, "certworker_http01_tokens", "HTTP-01 token", domain, token, s.claim, tokenTTL)
}

// deleteFenced deletes the row of token in table if claim ("" for none) wrote it, on
// a deadline of its own. A failure is logged, and the row expires by itself (ttl).
func deleteFenced(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, table, what, domain, token, claim string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenWriteTimeout)
	defer cancel()
	var c *string
	if claim != "" {
		c = &claim
	}
	if _, err := pool.Exec(ctx, `
DELETE FROM `+table+` WHERE token = $1 AND claim_token IS NOT DISTINCT FROM $2::uuid`, token, c); err != nil {
		// The row expires by itself; say so rather than fail the order.
		log.Warn("could not delete "+what+"; it expires by itself",
			issuing.LogDomainCtx(ctx, domain), zap.Duration("expires_in", ttl), zap.Error(err))
		return fmt.Errorf("delete %s: %w", what, err)
	}
	return nil
}

// The responder's limits. Together they decide what a flood of requests for tokens
// that are not pending costs the database: at most DefaultLookupsPerSecond queries a
// second per instance, whatever the flood's rate.
const (
	// DefaultLookupsPerSecond bounds the database look-ups of well-formed tokens the
	// memory does not hold. Such a miss is either noise (a scanner, a flood) or a
	// token whose notification has not reached this instance yet, which is rare and
	// brief (the notification leaves at the commit, before lego even tells the CA to
	// validate). 50 a second answers every CA that validates from a handful of places
	// at once, and is nothing to the database.
	DefaultLookupsPerSecond = 50

	// maxLookupWait is how long a miss may queue for its turn at the database: at 50
	// a second, ten misses wait at most; the rest are not looked up at all.
	maxLookupWait = 200 * time.Millisecond

	// DefaultMissWait is how long a miss that gets no turn waits for its token to
	// arrive by notification before it is answered 404: the notification is on its
	// way in milliseconds when the token is real, and every request of a flood is
	// held that long (a goroutine each, a few KiB).
	DefaultMissWait = 100 * time.Millisecond

	// lookupTimeout bounds a look-up. The CA's validation request waits on it; past
	// this the database counts as unreachable (503), and the CA retries or fails the
	// challenge, which the worker retries with backoff.
	lookupTimeout = 5 * time.Second

	// maxTokenLen rejects absurd paths before anything else. ACME tokens are 43
	// characters at Let's Encrypt (RFC 8555 §8.1 asks for at least 128 bits).
	maxTokenLen = 256

	// maxTokensLoaded bounds the tokens read into memory at a (re)connection. One
	// token per order in flight makes a few hundred at the most; the bound only keeps
	// a table filled by mistake from filling the memory.
	maxTokensLoaded = 10000

	// rereadTimeout bounds the re-read of a notified token, on the listening
	// connection: longer, and the connection is taken for lost.
	rereadTimeout = 5 * time.Second

	// TokenChannel is the notification channel of the tokens' trigger, whose
	// payload is the token stored, changed or deleted: the Responder's topic on the
	// process's listening connection.
	TokenChannel = "certworker_http01"
)

// ResponderOptions tune a Responder; the zero value is the production setting.
type ResponderOptions struct {
	// LookupsPerSecond bounds the look-ups of tokens the memory does not hold; 0 is
	// DefaultLookupsPerSecond.
	LookupsPerSecond float64
	// MissWait is how long a miss beyond that budget waits for its token's
	// notification; 0 is DefaultMissWait.
	MissWait time.Duration
	// Registerer, if not nil, receives certworker_http01_requests_total{result},
	// certworker_http01_tokens_held and certworker_http01_listener_connected.
	Registerer prometheus.Registerer
}

// Responder answers the CA's HTTP-01 validation requests: GET or
// HEAD /.well-known/acme-challenge/TOKEN is 200, text/plain, the key authorization,
// for an unexpired token stored by any instance, when the request's Host is the name
// the token was issued for (hostMatches); anything else is 404; 503 when the
// database cannot be reached and the answer is not in memory. It faces the internet,
// so most of what it hears is noise, and noise must not reach the proxy's database:
//
//   - a path that cannot hold an ACME token (RFC 8555: base64url, no padding) is 404
//     at once;
//   - the pending tokens of every instance are held in memory, loaded at each
//     (re)connection and kept current by the notifications of the tokens' trigger
//     on the process's listening connection, so a pending token is answered from
//     memory, also while the database is unreachable;
//   - a well-formed token the memory does not hold is looked up in the database, at
//     most LookupsPerSecond times a second; beyond that it waits MissWait for its
//     notification and is then 404 (or 503 while the listener is down, when the
//     memory cannot be trusted to be complete).
//
// The body of a 503 is generic: the database's error goes to the log, never to the
// client (it would tell anyone on the internet the database's address and user).
//
// A Responder is a topic (Connected, Notify, Disconnected) of the process's one
// listening connection, on TokenChannel (package listener's Listener.Listen); one
// that is on no connection answers from the database alone, within the same budget.
type Responder struct {
	pool    *pgxpool.Pool
	log     *zap.Logger
	opts    ResponderOptions
	lookups *rate.Limiter
	m       responderMetrics
	// lookupMu orders the turns taken at lookups, and lookupClock their times.
	lookupMu    sync.Mutex
	lookupClock steadyClock

	// tokens is read without a lock by every request; writers replace the whole map
	// (tokens are few) under mu.
	tokens    atomic.Pointer[map[string]heldToken]
	listening atomic.Bool

	mu sync.Mutex
	// changed is closed and replaced at every change of tokens; guarded by mu.
	changed chan struct{}
}

type heldToken struct {
	keyAuth string
	// domain is the name the token was issued for (certworker_http01_tokens.domain):
	// the only Host it is answered for.
	domain  string
	expires time.Time
}

// NewResponder returns a Responder reading pool's database. It holds no connection
// of its own: tokens are held in memory once it is a topic of a listening one.
func NewResponder(pool *pgxpool.Pool, log *zap.Logger, opts ResponderOptions) *Responder {
	if log == nil {
		log = zap.NewNop()
	}
	if opts.LookupsPerSecond <= 0 {
		opts.LookupsPerSecond = DefaultLookupsPerSecond
	}
	if opts.MissWait <= 0 {
		opts.MissWait = DefaultMissWait
	}
	r := &Responder{
		pool: pool,
		log:  log.Named("http01"),
		opts: opts,
		// A burst of one: "at most N a second" holds over any second, and misses
		// that come together queue for up to maxLookupWait.
		lookups: rate.NewLimiter(rate.Limit(opts.LookupsPerSecond), 1),
		m:       newResponderMetrics(opts.Registerer),
		changed: make(chan struct{}),
	}
	r.tokens.Store(&map[string]heldToken{})
	return r
}

// HTTP01Handler is a Responder that is not started: it answers from the database
// alone, within the look-up budget. For tests and tools; `certworker run` starts one.
func HTTP01Handler(pool *pgxpool.Pool, log *zap.Logger) http.Handler {
	return NewResponder(pool, log, ResponderOptions{})
}

// Listening reports whether the token listener holds a live connection, so that the
// memory is complete.
func (r *Responder) Listening() bool { return r.listening.Load() }

// ServeHTTP answers one validation request.
func (r *Responder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		r.m.result(resultMalformed)
		notFound(w)
		return
	}
	token, ok := strings.CutPrefix(req.URL.Path, http01.PathPrefix)
	if !ok || !isToken(token) {
		r.m.result(resultMalformed)
		notFound(w)
		return
	}
	h, ok := r.held(token)
	result := resultMemory
	if !ok {
		h, result = r.miss(req.Context(), token)
	}
	if (result == resultMemory || result == resultDatabase) && !hostMatches(req.Host, h.domain) {
		result = resultWrongHost
	}
	r.m.result(result)
	switch result {
	case resultMemory, resultDatabase:
		serveKeyAuth(w, req, h.keyAuth)
	case resultUnavailable:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("service unavailable\n"))
	default:
		notFound(w)
	}
}

// What a request came to, the label of certworker_http01_requests_total.
const (
	resultMemory      = "memory"      // answered from memory
	resultDatabase    = "database"    // a miss, found in the database
	resultNotFound    = "not_found"   // a miss, looked up and not found
	resultLimited     = "limited"     // a miss beyond the look-up budget: 404, no query
	resultMalformed   = "malformed"   // not a challenge path, or not a token: 404, no query
	resultUnavailable = "unavailable" // the database could not be asked: 503
	resultWrongHost   = "wrong_host"  // a pending token asked for under another Host: 404
)

// hostMatches reports whether a request's Host header names domain, as lego's own
// challenge server checks it (challenge/http01, hostMatcher): the port is dropped,
// case and a trailing dot are ignored. The CA asks for http://NAME/..., so its Host
// is the name it validates; a token answered for any Host would let whoever reaches
// the responder under another name (a DNS rebinding, a tenant's redirect from a name
// they do not own) present another name's authorization.
func hostMatches(host, domain string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host, domain = strings.TrimSuffix(host, "."), strings.TrimSuffix(domain, ".")
	return host != "" && strings.EqualFold(host, domain)
}

// held returns a token in memory that has not expired.
func (r *Responder) held(token string) (heldToken, bool) {
	t, ok := (*r.tokens.Load())[token]
	if !ok || !time.Now().Before(t.expires) {
		return heldToken{}, false
	}
	return t, true
}

// miss answers a well-formed token the memory does not hold: a look-up when the
// budget allows, otherwise a short wait for its notification.
func (r *Responder) miss(ctx context.Context, token string) (heldToken, string) {
	if delay, ok := r.lookupTurn(time.Now()); !ok {
		return r.await(ctx, token)
	} else if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return heldToken{}, resultLimited // the client has gone; nothing is written
		}
	}
	qctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	var h heldToken
	err := r.pool.QueryRow(qctx, `
SELECT key_authorization, domain, expires_at FROM certworker_http01_tokens
WHERE token = $1 AND expires_at > now()`, token).Scan(&h.keyAuth, &h.domain, &h.expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return heldToken{}, resultNotFound
	case err != nil:
		if ctx.Err() == nil {
			r.log.Warn("HTTP-01 token lookup failed", zap.Error(err))
		}
		return heldToken{}, resultUnavailable
	}
	// Kept only while notifications keep it current; otherwise a token deleted or
	// changed later would be served from a stale copy.
	if r.listening.Load() {
		r.update(func(m map[string]heldToken) { m[token] = h })
	}
	return h, resultDatabase
}

// lookupTurn takes a miss's turn at the database, asked for at now: how long until it
// comes, or false (and no turn taken) when that is more than maxLookupWait away.
func (r *Responder) lookupTurn(now time.Time) (time.Duration, bool) {
	r.lookupMu.Lock()
	defer r.lookupMu.Unlock()
	now = r.lookupClock.at(now)
	res := r.lookups.ReserveN(now, 1)
	if delay := res.DelayFrom(now); delay <= maxLookupWait {
		return delay, true
	}
	res.CancelAt(now)
	return 0, false
}

// await waits up to MissWait for token to arrive by notification. With the listener
// down the memory may be incomplete, and the answer is 503 rather than a 404 the CA
// would take as final.
func (r *Responder) await(ctx context.Context, token string) (heldToken, string) {
	if !r.listening.Load() {
		return heldToken{}, resultUnavailable
	}
	timer := time.NewTimer(r.opts.MissWait)
	defer timer.Stop()
	for {
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		if h, ok := r.held(token); ok {
			return h, resultMemory
		}
		select {
		case <-changed:
		case <-timer.C:
			return heldToken{}, resultLimited
		case <-ctx.Done():
			return heldToken{}, resultLimited
		}
	}
}

// update applies f to a copy of the tokens, drops the expired ones, publishes the
// copy and wakes the requests waiting for a token.
func (r *Responder) update(f func(map[string]heldToken)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	next := make(map[string]heldToken, len(*r.tokens.Load())+1)
	for k, v := range *r.tokens.Load() {
		if now.Before(v.expires) {
			next[k] = v
		}
	}
	f(next)
	r.tokens.Store(&next)
	r.m.tokens.Set(float64(len(next)))
	close(r.changed)
	r.changed = make(chan struct{})
}

// Connected loads every pending token on the listening connection conn (a topic
// of package listener's Listener, on TokenChannel), after LISTEN, so that a token
// stored in between is either loaded or notified; from then on the memory is
// complete.
func (r *Responder) Connected(ctx context.Context, conn *pgx.Conn, _ bool) error {
	rows, err := conn.Query(ctx, `
SELECT token, key_authorization, domain, expires_at FROM certworker_http01_tokens
WHERE expires_at > now() LIMIT $1`, maxTokensLoaded)
	if err != nil {
		return fmt.Errorf("load HTTP-01 tokens: %w", err)
	}
	loaded := map[string]heldToken{}
	var token string
	var h heldToken
	_, err = pgx.ForEachRow(rows, []any{&token, &h.keyAuth, &h.domain, &h.expires}, func() error {
		loaded[token] = h
		return nil
	})
	if err != nil {
		return fmt.Errorf("load HTTP-01 tokens: %w", err)
	}
	r.update(func(m map[string]heldToken) {
		clear(m)
		maps.Copy(m, loaded)
	})
	r.listening.Store(true)
	r.m.connected.Set(1)
	r.log.Info("HTTP-01 token listener connected", zap.Int("tokens", len(loaded)))
	return nil
}

// Notify reads the notified token's row again (reread).
func (r *Responder) Notify(ctx context.Context, conn *pgx.Conn, token string) error {
	return r.reread(ctx, conn, token)
}

// Disconnected marks the memory incomplete: tokens in it are still answered, and
// misses are looked up, or 503 beyond the budget. A lost connection is a warning; one
// closed because the process stops is not.
func (r *Responder) Disconnected(stopped bool) {
	if r.listening.Swap(false) && !stopped {
		r.log.Warn("HTTP-01 token listener lost; tokens in memory are still answered, misses are looked up")
	}
	r.m.connected.Set(0)
	r.update(func(map[string]heldToken) {}) // drops the expired
}

// reread reads the notified token's row again: stored or changed, it is held; gone
// or expired, it is forgotten.
func (r *Responder) reread(ctx context.Context, conn *pgx.Conn, token string) error {
	if !isToken(token) {
		return nil // not one a request could ask for
	}
	qctx, cancel := context.WithTimeout(ctx, rereadTimeout)
	defer cancel()
	var h heldToken
	err := conn.QueryRow(qctx, `
SELECT key_authorization, domain, expires_at FROM certworker_http01_tokens
WHERE token = $1 AND expires_at > now()`, token).Scan(&h.keyAuth, &h.domain, &h.expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		r.update(func(m map[string]heldToken) { delete(m, token) })
	case err != nil:
		return fmt.Errorf("read HTTP-01 token: %w", err)
	default:
		r.update(func(m map[string]heldToken) { m[token] = h })
	}
	return nil
}

func serveKeyAuth(w http.ResponseWriter, req *http.Request, keyAuth string) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if req.Method != http.MethodHead {
		_, _ = w.Write([]byte(keyAuth))
	}
}

func notFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("not found\n"))
}

// isToken reports whether s can be an ACME token: base64url without padding
// (RFC 8555 §8.3). Anything else is answered 404 without asking the database.
func isToken(s string) bool {
	if s == "" || len(s) > maxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// responderMetrics are the responder's Prometheus metrics; unregistered ones still
// count.
type responderMetrics struct {
	requests  *prometheus.CounterVec
	tokens    prometheus.Gauge
	connected prometheus.Gauge
}

func newResponderMetrics(reg prometheus.Registerer) responderMetrics {
	m := responderMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_http01_requests_total",
			Help: "HTTP-01 requests by result: memory, database (a miss found there), not_found (looked up, absent), limited (a miss beyond the look-up budget, not looked up), malformed (not a token), wrong_host (a pending token asked for under a Host that is not its name; 404), unavailable (503).",
		}, []string{"result"}),
		tokens: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_http01_tokens_held",
			Help: "Pending HTTP-01 tokens held in memory.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_http01_listener_connected",
			Help: "1 while the HTTP-01 token listener is connected (the memory is complete), else 0.",
		}),
	}
	for _, r := range []string{resultMemory, resultDatabase, resultNotFound, resultLimited, resultMalformed, resultWrongHost, resultUnavailable} {
		m.requests.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.tokens, m.connected)
	}
	return m
}

func (m responderMetrics) result(r string) { m.requests.WithLabelValues(r).Inc() }
