package acme

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-acme/lego/v4/challenge/http01"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
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

	// lookupTimeout bounds the responder's query. The CA's validation request waits
	// on it; past this the database counts as unreachable (503), and the CA retries
	// or fails the challenge, which the worker retries with backoff.
	lookupTimeout = 5 * time.Second

	// maxTokenLen rejects absurd paths before they reach the database. ACME tokens
	// are 43 characters at Let's Encrypt (RFC 8555 §8.1 asks for at least 128 bits).
	maxTokenLen = 256
)

// tokenStore is the lego HTTP-01 provider of one order: Present stores the token in
// PostgreSQL, where the responder of every instance (HTTP01Handler) finds it, and
// CleanUp deletes it.
type tokenStore struct {
	pool *pgxpool.Pool
	log  *zap.Logger
	// ctx is the order's: an order cancelled before its token is stored stores
	// nothing. CleanUp runs even so.
	ctx context.Context
	// presented is set once a token has been stored: lego got as far as the
	// challenge.
	presented atomic.Bool
}

// Present stores the token, and returns once the row is committed: lego tells the
// CA to validate only after Present returns, and the CA may reach any instance.
// Expired tokens (of orders whose instance died) are deleted by the same statement.
func (s *tokenStore) Present(domain, token, keyAuth string) error {
	ctx, cancel := context.WithTimeout(s.ctx, tokenWriteTimeout)
	defer cancel()
	_, err := s.pool.Exec(ctx, `
WITH expired AS (
    DELETE FROM certworker_http01_tokens WHERE expires_at < now()
)
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $2, $3, now() + $4 * interval '1 second')
ON CONFLICT (token) DO UPDATE
    SET key_authorization = EXCLUDED.key_authorization,
        domain = EXCLUDED.domain,
        expires_at = EXCLUDED.expires_at`,
		token, keyAuth, domain, int64(tokenTTL/time.Second))
	if err != nil {
		return fmt.Errorf("store HTTP-01 token: %w", err)
	}
	s.presented.Store(true)
	return nil
}

// CleanUp deletes the token. It runs after the order's context may have been
// cancelled (the worker gave the order up), so it uses its own deadline.
func (s *tokenStore) CleanUp(domain, token, _ string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), tokenWriteTimeout)
	defer cancel()
	if _, err := s.pool.Exec(ctx, `DELETE FROM certworker_http01_tokens WHERE token = $1`, token); err != nil {
		// The row expires by itself; say so rather than fail the order.
		s.log.Warn("could not delete HTTP-01 token; it expires by itself",
			zap.String("domain", domain), zap.Duration("expires_in", tokenTTL), zap.Error(err))
		return fmt.Errorf("delete HTTP-01 token: %w", err)
	}
	return nil
}

// HTTP01Handler answers the CA's HTTP-01 validation requests (CONTRACT.md §4):
// GET or HEAD /.well-known/acme-challenge/TOKEN is 200, text/plain, the key
// authorization, for an unexpired token stored by any instance; anything else is
// 404; 503 while the database cannot be reached. The body of a 503 is generic: the
// database's error goes to the log, never to the client (it would tell anyone on the
// internet the database's address and user).
func HTTP01Handler(pool *pgxpool.Pool, log *zap.Logger) http.Handler {
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("http01")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			notFound(w)
			return
		}
		token, ok := strings.CutPrefix(r.URL.Path, http01.PathPrefix)
		if !ok || !isToken(token) {
			notFound(w)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), lookupTimeout)
		defer cancel()
		var keyAuth string
		err := pool.QueryRow(ctx, `
SELECT key_authorization FROM certworker_http01_tokens
WHERE token = $1 AND expires_at > now()`, token).Scan(&keyAuth)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			notFound(w)
			return
		case err != nil:
			if r.Context().Err() == nil {
				log.Warn("HTTP-01 token lookup failed", zap.Error(err))
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("service unavailable\n"))
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte(keyAuth))
		}
	})
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
