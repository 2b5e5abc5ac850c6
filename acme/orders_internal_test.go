package acme

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/internal/freeport"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/queue/issuing"
)

// The read of a domain's recorded order comes before anything is sent to the CA: when
// the database gives no answer (here nothing listens), it says so with
// issuing.DatabaseUnavailableError, which the worker hands back uncharged; when the
// database answers with a refusal (here a database without certworker's tables:
// 42P01), the error stays what it was, and is charged.
func TestOrderBook_ADatabaseWithoutAnAnswerIsNotTheDomains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	port, release, err := freeport.Reserve()
	require.NoError(t, err)
	defer release()
	down, err := pgxpool.New(ctx, fmt.Sprintf("postgres://x:y@127.0.0.1:%d/none?sslmode=disable&connect_timeout=2", port))
	require.NoError(t, err)
	defer down.Close()
	book := &orderBook{pool: down, log: zap.NewNop(), directory: "https://ca.example/dir", domainID: uuid.NewString()}
	_, err = book.load(ctx)
	var unavailable *issuing.DatabaseUnavailableError
	require.ErrorAs(t, err, &unavailable)

	answering, err := pgxpool.New(ctx, pgtest.Shared(t).AdminURL) // the maintenance database: no certworker_orders
	require.NoError(t, err)
	defer answering.Close()
	book.pool = answering
	_, err = book.load(ctx)
	var pg *pgconn.PgError
	require.ErrorAs(t, err, &pg)
	require.Equal(t, "42P01", pg.Code)
	require.False(t, errors.As(err, &unavailable), "an answer of the database's was taken for no answer: %v", err)
}

// A read that gets no answer within its own bound (tokenWriteTimeout), while the
// order's context is live, is no answer too: a server that accepts the connection
// and never speaks. The check once read the bound's context, which had ended, and
// charged it.
func TestOrderBook_AReadPastItsOwnBoundIsNoAnswer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // never answered
		}
	}()
	ctx := context.Background()
	silent, err := pgxpool.New(ctx, "postgres://x:y@"+ln.Addr().String()+"/none?sslmode=disable")
	require.NoError(t, err)
	defer silent.Close()
	book := &orderBook{pool: silent, log: zap.NewNop(), directory: "https://ca.example/dir", domainID: uuid.NewString()}
	start := time.Now()
	_, err = book.load(ctx)
	var unavailable *issuing.DatabaseUnavailableError
	require.ErrorAs(t, err, &unavailable)
	require.GreaterOrEqual(t, time.Since(start), tokenWriteTimeout, "the read gave up before its own bound")
}
