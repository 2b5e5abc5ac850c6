package certstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// loadSQL reads what serving name takes: its domain row's verification, and the
// certificate stored under that row's exact name (as the worker pairs them). $2 is
// the version already held: when the row still has it, the certificate and key are
// not sent again.
//
// Two rows whose names differ only in case (case twins) are served by the rule the
// claim applies (queue.KeepsNameSQL, CONTRACT.md §5): only verified acme rows count,
// so a twin that is unverified or not acme never stops the verified one being
// served; of verified acme twins only the one that keeps the name comes back, first.
// Without a verified acme row, the verified rows come first: two of them (two
// uploads, say) are not served, as either could be another tenant's.
var loadSQL = `
SELECT d.verification_status, d.verification_status = 'verified' AND d.ssl_provider = 'acme',
       c.domain IS NOT NULL, COALESCE(c.version, 0),
       CASE WHEN COALESCE(c.version, 0) = $2 THEN NULL ELSE c.certificate_pem END,
       CASE WHEN COALESCE(c.version, 0) = $2 THEN NULL ELSE c.private_key_pem END
FROM proxy_domains d
LEFT JOIN proxy_certificates c ON c.domain = d.domain
WHERE lower(d.domain) = $1
  AND NOT (d.verification_status = 'verified' AND d.ssl_provider = 'acme' AND NOT ` + queue.KeepsNameSQL("d") + `)
ORDER BY d.verification_status = 'verified' AND d.ssl_provider = 'acme' DESC, d.verification_status = 'verified' DESC
LIMIT 2`

// ownVerified reports whether a verified domain row of the name's own was read:
// then the name is served its own certificate or none, never a wildcard's.
func ownVerified(rows []row) bool {
	for _, r := range rows {
		if r.verification == "verified" {
			return true
		}
	}
	return false
}

// wildcardBase is the base of the wildcard that may serve name: its parent, when
// that has at least two labels (a wildcard's base is a name of its own; *.com is
// never one).
func wildcardBase(name string) (string, bool) {
	_, parent, ok := strings.Cut(name, ".")
	return parent, ok && strings.Contains(parent, ".")
}

// row is one result of loadSQL.
type row struct {
	verification string
	acme         bool
	hasCert      bool
	version      int64
	chainPEM     *string
	keyStored    *string
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
	held := int64(-1) // no version is -1: every row is sent
	if cur != nil && cur.cert != nil {
		held = cur.version
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.LoadTimeout)
	defer cancel()
	rows, err := s.query(ctx, name, held)
	keyName := name
	if err == nil && !ownVerified(rows) {
		if base, ok := wildcardBase(name); ok {
			// No verified row of its own, whatever its tenant: the wildcard of its
			// parent, if one is stored, serves it (CONTRACT §5).
			var wild []row
			if wild, err = s.query(ctx, "*."+base, held); err == nil && len(wild) > 0 {
				rows, keyName = wild, "*."+base
			}
		}
	}
	now := time.Now()
	if err != nil {
		s.log.Warn("cannot load certificate", zap.String("domain", name), zap.Error(err))
		return s.unavailable(name, from, fmt.Errorf("%w: %w", ErrUnavailable, err), now)
	}
	r := s.interpret(name, keyName, rows, cur, now)
	r.from = from
	s.log.Debug("loaded", zap.String("domain", name), zap.Bool("served", r.cert != nil), zap.Int64("version", r.version), zap.Uint64("epoch", from))
	return s.apply(name, r)
}

// query runs loadSQL, holding one of the MaxLoads slots while it does.
func (s *Store) query(ctx context.Context, name string, held int64) ([]row, error) {
	select {
	case s.loadSlots <- struct{}{}:
		defer func() { <-s.loadSlots }()
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a load slot: %w", ctx.Err())
	}
	rs, err := s.pool.Query(ctx, loadSQL, name, held)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.verification, &x.acme, &x.hasCert, &x.version, &x.chainPEM, &x.keyStored)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", name, err)
	}
	return out, nil
}

// interpret turns the rows of loadSQL into an entry: the certificate to serve, or
// why there is none. cur is what was held when the load began.
//
// keyName is the name of the domain row that was read: name, or the wildcard that
// serves it, under which its key is sealed.
func (s *Store) interpret(name, keyName string, rows []row, cur *entry, now time.Time) *entry {
	miss := func(err error) *entry { return &entry{miss: err, freshUntil: now.Add(s.opts.MissTTL)} }
	switch {
	case len(rows) == 0:
		return miss(ErrUnknownName)
	case len(rows) > 1 && !rows[0].acme && rows[1].verification == "verified":
		s.log.Warn("two verified domain rows differ only in case, neither from ACME; neither is served", zap.String("domain", name))
		return miss(fmt.Errorf("%w: two domain rows differ only in case", ErrUnknownName))
	case rows[0].verification != "verified":
		return miss(ErrNotVerified)
	case !rows[0].hasCert:
		return miss(ErrNoCertificate)
	}
	r := rows[0]
	if r.chainPEM == nil || r.keyStored == nil {
		// The version held is still the row's: keep the certificate, check again
		// after a TTL.
		e := *cur
		e.freshUntil, e.retryAt = now.Add(s.opts.TTL), time.Time{}
		if !e.servable(now) {
			return miss(fmt.Errorf("%w: not valid after %s", ErrUnusable, e.notAfter.UTC().Format(time.RFC3339)))
		}
		return &e
	}
	cert, err := s.parse(name, keyName, *r.chainPEM, *r.keyStored, now)
	if err != nil {
		s.log.Error("stored certificate cannot be served", zap.String("domain", name),
			zap.Int64("version", r.version), zap.Error(err))
		return miss(err)
	}
	return &entry{cert: cert, notAfter: cert.Leaf.NotAfter, version: r.version, freshUntil: now.Add(s.opts.TTL)}
}

// parse opens the stored key (bound to keyName, its domain row's name in lower case,
// as the worker seals it) and pairs it with the chain; the leaf must be valid now
// and cover name.
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
