package certstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
)

// loadSQL asks certworker_certificate_for (migrations/functions) what to serve for
// $1, a server name in lower case without a trailing dot: the rule of what is served
// (a name's own verified row, case twins, the wildcard one label above) is written
// there once, for this store and for proxies in any language. $2 and $3 are the
// version and domain of the certificate already held: when the function's row still
// has them, the certificate and key are not sent again.
//
// When nothing is served, the last column describes the rows behind the refusal, for
// GetCertificate's error alone (missFacts): it decides nothing. $4 is the wildcard
// one label above the name, or NULL.
const loadSQL = `
SELECT f.domain, f.version,
       CASE WHEN f.version = $2 AND f.domain = $3 THEN NULL ELSE f.certificate_pem END,
       CASE WHEN f.version = $2 AND f.domain = $3 THEN NULL ELSE f.private_key_pem END,
       CASE WHEN f.domain IS NULL THEN (
           SELECT ARRAY[count(*) FILTER (WHERE r.own), count(*) FILTER (WHERE r.own AND r.verified),
                        count(*) FILTER (WHERE r.own AND r.verified AND r.acme),
                        count(*) FILTER (WHERE NOT r.own), count(*) FILTER (WHERE NOT r.own AND r.verified),
                        count(*) FILTER (WHERE NOT r.own AND r.verified AND r.acme)]
           FROM (SELECT lower(d.domain) = $1 AS own, d.verification_status = 'verified' AS verified,
                        d.ssl_provider = 'acme' AS acme
                 FROM proxy_domains d WHERE lower(d.domain) = $1 OR lower(d.domain) = $4) AS r)
       END
FROM (VALUES (true)) AS asked(x)
LEFT JOIN certworker_certificate_for($1) AS f ON true`

// rowCounts are a name's domain rows, by what the serving rule looks at.
type rowCounts struct{ rows, verified, verifiedACME int64 }

// missFacts are the domain rows of a name that is not served, and of the wildcard
// one label above it.
type missFacts struct{ own, wildcard rowCounts }

// reason is why nothing is served, as GetCertificate reports it. It describes the
// rows certworker_certificate_for judged: the name's own when one of them is
// verified or no wildcard row exists, else the wildcard's.
func (f missFacts) reason() error {
	c := f.own
	if c.verified == 0 && f.wildcard.rows > 0 {
		c = f.wildcard
	}
	switch {
	case c.rows == 0:
		return ErrUnknownName
	case c.verified == 0:
		return ErrNotVerified
	case c.verified > 1 && c.verifiedACME == 0:
		return errTwins
	default:
		return ErrNoCertificate
	}
}

// errTwins: two verified rows whose names differ only in case, neither from ACME
// (two uploads, say), are not served, as either could be another tenant's.
var errTwins = fmt.Errorf("%w: two domain rows differ only in case", ErrUnknownName)

// wildcardBase is the base of the wildcard that may serve name: its parent, when
// that has at least two labels (a wildcard's base is a name of its own; *.com is
// never one).
func wildcardBase(name string) (string, bool) {
	_, parent, ok := strings.Cut(name, ".")
	return parent, ok && strings.Contains(parent, ".")
}

// row is the result of loadSQL.
type row struct {
	// domain is the certificate row's name in lower case (*.base for a wildcard),
	// which its key is sealed to; NULL when nothing is served.
	domain    *string
	version   *int64
	chainPEM  *string
	keyStored *string
	// miss is missFacts, in the order loadSQL counts them, when nothing is served.
	miss []int64
}

// load reads name from the database and records the outcome in the cache. It never
// fails: what it could not do is in the entry it returns (a miss, or the entry held
// before when the database could not be asked).
func (s *Store) load(name string) *entry {
	from, cur := s.begin(name)
	if cur != nil && cur.current(time.Now()) {
		// Loaded since the caller looked: a handshake that found nothing just
		// before the previous load of this name finished.
		return cur
	}
	held, heldDomain := int64(-1), "" // nothing held: every row is sent
	if cur != nil && cur.cert != nil {
		held, heldDomain = cur.version, cur.domain
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.LoadTimeout)
	defer cancel()
	r, err := s.query(ctx, name, held, heldDomain)
	now := time.Now()
	if err != nil {
		s.log.Warn("cannot load certificate", zap.String("domain", name), zap.Error(err))
		return s.unavailable(name, from, fmt.Errorf("%w: %w", ErrUnavailable, err), now)
	}
	e := s.interpret(name, r, cur, now)
	e.from = from
	s.log.Debug("loaded", zap.String("domain", name), zap.Bool("served", e.cert != nil), zap.Int64("version", e.version), zap.Uint64("epoch", from))
	return s.apply(name, e)
}

// query runs loadSQL, holding one of the MaxLoads slots while it does.
func (s *Store) query(ctx context.Context, name string, held int64, heldDomain string) (row, error) {
	var r row
	select {
	case s.loadSlots <- struct{}{}:
		defer func() { <-s.loadSlots }()
	case <-ctx.Done():
		return r, fmt.Errorf("wait for a load slot: %w", ctx.Err())
	}
	var wildcard *string
	if base, ok := wildcardBase(name); ok {
		w := "*." + base
		wildcard = &w
	}
	err := s.pool.QueryRow(ctx, loadSQL, name, held, heldDomain, wildcard).Scan(&r.domain, &r.version, &r.chainPEM, &r.keyStored, &r.miss)
	if err != nil {
		return r, fmt.Errorf("load %s: %w", name, err)
	}
	return r, nil
}

// interpret turns the row of loadSQL into an entry: the certificate to serve, or
// why there is none. cur is what was held when the load began.
func (s *Store) interpret(name string, r row, cur *entry, now time.Time) *entry {
	miss := func(err error) *entry { return &entry{miss: err, freshUntil: now.Add(s.opts.MissTTL)} }
	if r.domain == nil || r.version == nil {
		if len(r.miss) != 6 {
			return miss(fmt.Errorf("%w: the database described the name in %d counts, not 6", ErrUnknownName, len(r.miss)))
		}
		m := r.miss
		why := missFacts{own: rowCounts{m[0], m[1], m[2]}, wildcard: rowCounts{m[3], m[4], m[5]}}.reason()
		if why == errTwins {
			s.log.Warn("two verified domain rows differ only in case, neither from ACME; neither is served", zap.String("domain", name))
		}
		return miss(why)
	}
	if r.chainPEM == nil || r.keyStored == nil {
		// The certificate held is still the one to serve: keep it, check again
		// after a TTL.
		e := *cur
		e.freshUntil, e.retryAt = now.Add(s.opts.TTL), time.Time{}
		if !e.servable(now) {
			return miss(fmt.Errorf("%w: not valid after %s", ErrUnusable, e.notAfter.UTC().Format(time.RFC3339)))
		}
		return &e
	}
	cert, err := s.parse(name, *r.domain, *r.chainPEM, *r.keyStored, now)
	if err != nil {
		s.log.Error("stored certificate cannot be served", zap.String("domain", name),
			zap.Int64("version", *r.version), zap.Error(err))
		return miss(err)
	}
	return &entry{cert: cert, notAfter: cert.Leaf.NotAfter, version: *r.version, domain: *r.domain, freshUntil: now.Add(s.opts.TTL)}
}

// parse opens the stored key (bound to keyName, the name of its certificate row in
// lower case, as the worker seals it: name, or the wildcard serving it) and pairs it
// with the chain; the leaf must be valid now and cover name.
func (s *Store) parse(name, keyName, chainPEM, keyStored string, now time.Time) (*tls.Certificate, error) {
	keyPEM, err := s.opts.KeyEncryptionKeys.Open(keyStored, keyName)
	if err != nil {
		return nil, fmt.Errorf("%w: key: %w", ErrUnusable, err)
	}
	cert, err := tls.X509KeyPair([]byte(chainPEM), keyPEM)
	if err != nil {
		// The standard library's messages describe the PEM, never quote the key.
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	leaf := cert.Leaf
	switch {
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("%w: not valid before %s", ErrUnusable, leaf.NotBefore.UTC().Format(time.RFC3339))
	case !now.Before(leaf.NotAfter):
		return nil, fmt.Errorf("%w: not valid after %s", ErrUnusable, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := leaf.VerifyHostname(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnusable, err)
	}
	return &cert, nil
}
