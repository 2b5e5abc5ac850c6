package acme

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// valueStore writes the DNS-01 TXT values of one order to certworker_dns01_values,
// where the zone's server of every instance (DNS01Server) answers them, and deletes
// them when the order is over. Writes are fenced by the order's claim exactly as the
// HTTP-01 tokens' (tokenStore): a value is written only while the claim is held, and
// deleted only by the claim that wrote it.
type valueStore struct {
	pool *pgxpool.Pool
	log  *zap.Logger
	ctx  context.Context
	// zone is --dns01-zone; the target label of a name is dns01Label(zone, name).
	zone  string
	claim string
}

// presentValueSQL stores a value ($1 token, $2 target, $3 value, $4 domain, $5
// seconds to live) for claim $6, as presentSQL does for an HTTP-01 token, and deletes
// expired values in the same statement.
func presentValueSQL(fenced bool) string {
	return `
WITH held AS (
    ` + heldSQL(fenced, 6) + `
), expired AS (
    DELETE FROM certworker_dns01_values WHERE expires_at < now()
)
INSERT INTO certworker_dns01_values (token, target, value, domain, expires_at, claim_token)
SELECT $1, $2, $3, $4, now() + $5 * interval '1 second', held.claim FROM held
ON CONFLICT (token) DO UPDATE
    SET target = EXCLUDED.target, value = EXCLUDED.value, domain = EXCLUDED.domain,
        expires_at = EXCLUDED.expires_at, claim_token = EXCLUDED.claim_token
RETURNING 1`
}

// Present stores the TXT value of the challenge token for domain (NAME or *.NAME), and
// returns once it is committed: the CA is told to validate only after.
func (s *valueStore) Present(domain, token, keyAuth string) error {
	return s.put(domain, token, DNS01Value(keyAuth), dns01ValueTTL)
}

// put stores value under token at domain's target.
func (s *valueStore) put(domain, token, value string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(s.ctx, tokenWriteTimeout)
	defer cancel()
	args := []any{token, dns01Label(s.zone, domain), value, domain, int64(ttl / time.Second)}
	return writeFenced(ctx, s.pool, presentValueSQL(s.claim != ""), s.claim, args, "store DNS-01 value")
}

// CleanUp deletes the value, if this order's claim wrote it, on its own deadline.
func (s *valueStore) CleanUp(domain, token, _ string) error {
	return deleteFenced(s.ctx, s.pool, s.log, "certworker_dns01_values", "DNS-01 value", domain, token, s.claim, dns01ValueTTL)
}
