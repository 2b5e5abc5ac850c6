// Command fakeworker runs the real worker loop (queue.Worker fed by a
// listener.Listener, on a pgxpool) with fakeissuer as its issuer, as a process of its
// own. It exists only for the tests in this directory, which kill it, stop it with a
// signal, or take its database away, and read its JSON logs: behaviour that an
// in-process worker cannot show, since a goroutine cannot be SIGKILLed. It is not a
// command to deploy; cmd/certworker is.
//
// Logs are zap JSON lines on stderr at debug level, unsampled, so that a test can
// count them. It exits 0 after SIGTERM or SIGINT once the worker has stopped, 1 if it
// cannot start, 2 on bad flags or on a schema `certworker run` would refuse
// (migrations.Check), so that the upgrade tests restart it as they would run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

func main() {
	fs := flag.NewFlagSet("fakeworker", flag.ContinueOnError)
	dsn := fs.String("database-url", "", "PostgreSQL connection string (required)")
	owner := fs.String("owner", "", "ssl_claimed_by of this instance (default host:pid)")
	concurrency := fs.Int("concurrency", 1, "orders in flight")
	delay := fs.Duration("delay", 0, "how long the fake issuer takes per order")
	lease := fs.Duration("lease", 0, "claim lease, issuing.Config.Lease (0: the production default)")
	poll := fs.Duration("poll-interval", 30*time.Second, "safety-net pass interval")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "time given to in-flight orders on SIGTERM")
	retryBase := fs.Duration("retry-base", 0, "first gap between attempts (0: the production default)")
	reconnectMax := fs.Duration("reconnect-max", 0, "the listener's longest reconnection delay (0: the production default)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "fakeworker: --database-url is required")
		os.Exit(2)
	}
	if *owner == "" {
		host, _ := os.Hostname()
		*owner = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if err := run(*dsn, *owner, *concurrency, *delay, *poll, *grace, *reconnectMax,
		issuing.Config{RetryBase: *retryBase, Lease: *lease}); err != nil {
		fmt.Fprintln(os.Stderr, "fakeworker:", err)
		var refused *schemaRefused
		if errors.As(err, &refused) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// schemaRefused is a schema migrations.Check refuses.
type schemaRefused struct{ err error }

func (e *schemaRefused) Error() string { return e.err.Error() }
func (e *schemaRefused) Unwrap() error { return e.err }

// checkSchema is run's check of the schema at start.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Check(ctx, db); err != nil {
		return &schemaRefused{err}
	}
	return nil
}

func run(dsn, owner string, concurrency int, delay, poll, grace, reconnectMax time.Duration, qcfg issuing.Config) error {
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zapcore.DebugLevel)
	cfg.Sampling = nil
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	log, err := cfg.Build()
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("--database-url: %w", err)
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = 10 * time.Second // as cmd/certworker
	}
	// The worker's bounds for its lease, as cmd/certworker; not warmed up for the wake
	// path, as the in-process tests' pools (docs/testing.md), so that a process under
	// test starts as quickly as the machine lets it.
	queue.ConfigureSession(pcfg, queue.WorkerSession(qcfg.Lease))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool); err != nil {
		return err
	}

	issuer := fakeissuer.New(0)
	issuer.Delay = delay
	w, err := worker.New(worker.Config{
		Pool: pool, Issuer: issuer, Log: log,
		WakeOptions:   listener.Options{BackoffMax: reconnectMax},
		Owner:         owner,
		Directory:     "https://fake-issuer.invalid/directory",
		Queue:         qcfg,
		Concurrency:   concurrency,
		PollInterval:  poll,
		ShutdownGrace: grace,
	})
	if err != nil {
		return err
	}
	return w.Run(ctx)
}
