package acme_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/certworker/certworker/acme"
)

func storeToken(t *testing.T, pool *pgxpool.Pool, token, keyAuth string, expiresIn time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $2, 'h.example', now() + $3 * interval '1 millisecond')`,
		token, keyAuth, expiresIn.Milliseconds())
	require.NoError(t, err)
}

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// The responder serves what any instance stored, and nothing else. Guards against
// serving expired tokens of dead orders, answering paths outside the challenge
// directory, and a wrong content type (some CAs are strict about it).
func TestHTTP01Handler_ServesStoredUnexpiredTokensOnly(t *testing.T) {
	t.Parallel()
	pool, _ := newTestPool(t)
	h := acme.HTTP01Handler(pool, zap.NewNop())
	storeToken(t, pool, "live-token_1", "live-token_1.thumbprint", time.Hour)
	storeToken(t, pool, "expired-token", "expired-token.thumbprint", -time.Second)

	resp := get(t, h, http.MethodGet, "/.well-known/acme-challenge/live-token_1")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/plain", resp.Header.Get("Content-Type"))
	require.Equal(t, "live-token_1.thumbprint", body(t, resp))

	resp = get(t, h, http.MethodHead, "/.well-known/acme-challenge/live-token_1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "HEAD is answered like GET")
	require.Empty(t, body(t, resp))

	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/.well-known/acme-challenge/unknown-token"},
		{http.MethodGet, "/.well-known/acme-challenge/expired-token"},
		{http.MethodGet, "/.well-known/acme-challenge/"},
		{http.MethodGet, "/.well-known/acme-challenge/live-token_1/more"},
		{http.MethodGet, "/.well-known/acme-challenge/live-token_1.x"},
		{http.MethodGet, "/.well-known/acme-challenge/" + strings.Repeat("a", 300)},
		{http.MethodGet, "/"},
		{http.MethodGet, "/live-token_1"},
		{http.MethodPost, "/.well-known/acme-challenge/live-token_1"},
		{http.MethodDelete, "/.well-known/acme-challenge/live-token_1"},
	} {
		resp := get(t, h, tc.method, tc.path)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s", tc.method, tc.path)
		require.NotContains(t, body(t, resp), "thumbprint")
	}
}

// While the database is unreachable the responder says 503 (the CA may retry), and
// the client learns nothing of the database; the error goes to the log. Guards
// against a 404 that makes the CA fail the challenge for good, and against the
// database's address or user shown to anyone on the internet.
func TestHTTP01Handler_DatabaseUnreachableIs503WithGenericBody(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(),
		"postgres://certworker:hunter2secret@127.0.0.1:"+closedPort(t)+"/certworker?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	core, logs := observer.New(zap.DebugLevel)
	h := acme.HTTP01Handler(pool, zap.New(core))

	start := time.Now()
	resp := get(t, h, http.MethodGet, "/.well-known/acme-challenge/some-token")
	require.Less(t, time.Since(start), 10*time.Second)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	got := body(t, resp)
	require.Equal(t, "service unavailable\n", got)
	for _, leak := range []string{"127.0.0.1", "certworker", "hunter2", "dial", "connect", "postgres"} {
		require.NotContains(t, got, leak)
	}
	require.Equal(t, 1, logs.FilterMessage("HTTP-01 token lookup failed").Len(), "the database error is logged")
	for _, e := range logs.All() {
		for _, v := range e.ContextMap() {
			require.NotContains(t, toString(v), "hunter2", "the password must not be logged")
		}
	}

	// Paths that are not challenges do not need the database: still 404.
	require.Equal(t, http.StatusNotFound, get(t, h, http.MethodGet, "/").StatusCode)
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}
