package acme

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
