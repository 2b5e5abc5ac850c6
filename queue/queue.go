package queue

import (
	"context"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the queue needs from PostgreSQL: a *pgxpool.Pool, or a connection.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

var _ DB = (*pgxpool.Pool)(nil)

// Queue is the statements that move domains between states; safe for concurrent use.
type Queue struct {
	db  DB
	cfg issuing.Config
	// enc is the database's server encoding, as errorText needs it.
	enc *serverEncoding
}

// New returns a Queue on db with the given curve (zero fields take the defaults).
func New(db DB, cfg issuing.Config) *Queue {
	return &Queue{db: db, cfg: cfg.WithDefaults(), enc: &serverEncoding{}}
}

// Config is the queue's effective configuration.
func (q *Queue) Config() issuing.Config { return q.cfg }

func seconds(d time.Duration) float64 { return d.Seconds() }
