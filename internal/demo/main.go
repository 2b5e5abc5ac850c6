// Command demo runs certworker end to end with nothing installed: PostgreSQL in a
// container (or DATABASE_URL), Pebble in-process as the CA with its own DNS, the
// worker with its HTTP-01 responder, and a tenant who verifies a handful of domains
// one by one. It prints each domain going pending, provisioning, active, and then
// served: an HTTPS handshake for the name through a TLS server whose certificates
// come from certstore (as the proxy's would), with the time from "verify" to each,
// and a summary.
//
//	make demo            # or: go run ./internal/demo
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore"
	"github.com/certworker/certworker/internal/loopback"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/internal/pgtest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

func main() {
	n := flag.Int("domains", 5, "how many domains the tenant verifies")
	gap := flag.Duration("gap", time.Second, "time between two verifications")
	verbose := flag.Bool("v", false, "show the worker's info logs")
	flag.Parse()
	if err := run(*n, *gap, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type domainRow struct {
	name       string
	id         string
	verifiedAt time.Time
	seen       map[string]time.Time
}

func run(n int, gap time.Duration, verbose bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	level := zapcore.WarnLevel
	if verbose {
		level = zapcore.InfoLevel
	}
	logCfg := zap.NewDevelopmentConfig()
	logCfg.Level = zap.NewAtomicLevelAt(level)
	log, err := logCfg.Build()
	if err != nil {
		return err
	}

	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		fmt.Printf("starting PostgreSQL (%s) in a container...\n", pgtest.Image())
		srv, err := pgtest.StartContainer(ctx)
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w (set DATABASE_URL to use a server of your own)", err)
		}
		defer srv.Terminate(context.Background()) //nolint:errcheck
		dsn = srv.URL("postgres")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	if _, err := migrations.ApplyDB(ctx, db); err != nil {
		return err
	}
	db.Close()
	// Set up as `certworker run` sets up its pool: the worker's bounds, and each
	// connection warmed up for the wake path (the CA is not known yet: its directory
	// only weighs in the warm-up's estimates).
	pool, err := queue.NewPoolWith(ctx, dsn, queue.WorkerSessionFor(issuing.DefaultConfig(), ""))
	if err != nil {
		return err
	}
	defer pool.Close()

	// The HTTP-01 responder, on the port Pebble's VA validates against.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	tokens := acme.NewResponder(pool, log, acme.ResponderOptions{})
	responder := &http.Server{Handler: tokens, ReadHeaderTimeout: 5 * time.Second}
	go responder.Serve(ln) //nolint:errcheck
	defer responder.Close()

	fmt.Println("starting Pebble, an ACME test CA, in-process...")
	ca, err := pebbletest.Start(pebbletest.Options{HTTPPort: ln.Addr().(*net.TCPAddr).Port})
	if err != nil {
		return err
	}
	defer ca.Close()

	issuer, err := acme.New(ctx, pool, log, acme.Config{Recorder: queue.New(pool, issuing.DefaultConfig()), DirectoryURL: ca.DirectoryURL, CABundle: ca.RootsFile, Email: "demo@example.com",
		Profile: pebbletest.DefaultProfile})
	if err != nil {
		return err
	}
	w, err := worker.New(worker.Config{
		Pool: pool, Issuer: issuer, Log: log, Owner: "demo", Directory: issuer.DirectoryURL(),
		Concurrency: 4, PollInterval: 30 * time.Second, ShutdownGrace: 5 * time.Second,
		// The responder's tokens ride on the worker's listening connection, as in run.
		Topics: map[string]listener.Topic{acme.TokenChannel: tokens},
	})
	if err != nil {
		return err
	}
	wctx, wstop := context.WithCancel(ctx)
	if err := w.Start(wctx); err != nil {
		wstop()
		return err
	}
	defer func() { wstop(); _ = w.Wait() }()

	// The proxy's side: a TLS server that serves what certworker stores, told of each
	// new certificate by NOTIFY certworker_certificate.
	store, err := certstore.Open(ctx, pool, certstore.Options{Logger: log})
	if err != nil {
		return err
	}
	defer store.Close()
	https, err := loopback.Serve(&tls.Config{GetCertificate: store.GetCertificate})
	if err != nil {
		return err
	}
	defer https.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.IssuerRootsPEM())

	var tenant string
	if err := pool.QueryRow(ctx, `INSERT INTO proxy_tenants (name, slug, email) VALUES ('Demo Shop', $1, 'owner@example.com') RETURNING id::text`,
		fmt.Sprintf("demo-%d", time.Now().UnixNano())).Scan(&tenant); err != nil {
		return err
	}
	rows := make([]*domainRow, n)
	for i := range rows {
		name := fmt.Sprintf("shop%d-%d.example", i+1, time.Now().Unix()%100000)
		d := &domainRow{name: name, seen: map[string]time.Time{}}
		if err := pool.QueryRow(ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
VALUES ($1, $2, 'demo-token', 'acme') RETURNING id::text`, tenant, name).Scan(&d.id); err != nil {
			return err
		}
		rows[i] = d
	}
	fmt.Printf("tenant %q added %d domains; verifying them one by one, %s apart\n\n", "Demo Shop", n, gap)

	next := 0
	verifyTick := time.NewTicker(gap)
	defer verifyTick.Stop()
	watch := time.NewTicker(5 * time.Millisecond)
	defer watch.Stop()
	deadline := time.After(time.Duration(n)*gap + 2*time.Minute)
	verify := func() error {
		d := rows[next]
		next++
		if _, err := pool.Exec(ctx, `UPDATE proxy_domains SET verification_status = 'verified', updated_at = now() WHERE id = $1`, d.id); err != nil {
			return err
		}
		d.verifiedAt = time.Now()
		fmt.Printf("%-26s verified\n", d.name)
		return nil
	}
	if err := verify(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errors.New("not every domain became active within the time allowed; run with -v to see the worker's logs")
		case <-verifyTick.C:
			if next < len(rows) {
				if err := verify(); err != nil {
					return err
				}
			}
		case <-watch.C:
			done := 0
			for _, d := range rows[:next] {
				var status string
				var sslErr *string
				if err := pool.QueryRow(ctx, `SELECT ssl_status, ssl_error FROM proxy_domains WHERE id = $1`, d.id).Scan(&status, &sslErr); err != nil {
					return err
				}
				if _, ok := d.seen[status]; !ok {
					d.seen[status] = time.Now()
					line := fmt.Sprintf("%-26s %-12s +%s", d.name, status, time.Since(d.verifiedAt).Round(time.Millisecond))
					if status == "failed" || (status == "pending" && sslErr != nil) {
						line += "  error: " + deref(sslErr)
					}
					fmt.Println(line)
				}
				if status == "active" {
					if _, served := d.seen["https"]; !served {
						hctx, cancel := context.WithTimeout(ctx, time.Second)
						if _, err := https.Get(hctx, d.name, roots); err == nil {
							d.seen["https"] = time.Now()
							fmt.Printf("%-26s %-12s +%s\n", d.name, "served", time.Since(d.verifiedAt).Round(time.Millisecond))
						}
						cancel()
					}
				}
				if (status == "active" && !d.seen["https"].IsZero()) || status == "failed" {
					done++
				}
			}
			if done == len(rows) {
				return summary(ctx, pool, rows)
			}
		}
	}
}

func summary(ctx context.Context, pool *pgxpool.Pool, rows []*domainRow) error {
	fmt.Println("\nsummary")
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tSTATUS\tVERIFY→CLAIM\tVERIFY→ACTIVE\tVERIFY→HTTPS\tNOT AFTER\tRENEWS AT")
	for _, d := range rows {
		var status string
		var notAfter, renewAt *time.Time
		_ = pool.QueryRow(ctx, `
SELECT d.ssl_status, c.expires_at, c.renew_at FROM proxy_domains d
LEFT JOIN proxy_certificates c ON c.domain = d.domain WHERE d.id = $1`, d.id).Scan(&status, &notAfter, &renewAt)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.name, status,
			since(d.verifiedAt, d.seen["provisioning"]), since(d.verifiedAt, d.seen["active"]),
			since(d.verifiedAt, d.seen["https"]), day(notAfter), day(renewAt))
	}
	return tw.Flush()
}

func since(from, to time.Time) string {
	if to.IsZero() {
		return "-"
	}
	return to.Sub(from).Round(time.Millisecond).String()
}

func day(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
