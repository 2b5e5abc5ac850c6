package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
)

// letsEncrypt is the default --acme-directory.
const letsEncrypt = "https://acme-v02.api.letsencrypt.org/directory"

type runCmd struct {
	dbFlags
	ACMEDirectory    string        `name:"acme-directory" env:"CERTWORKER_ACME_DIRECTORY" default:"${le}" placeholder:"URL" help:"ACME directory URL (default: Let's Encrypt production)."`
	ACMEEmail        string        `name:"acme-email" env:"CERTWORKER_ACME_EMAIL" placeholder:"EMAIL" help:"ACME account contact."`
	ACMECABundle     string        `name:"acme-ca-bundle" env:"CERTWORKER_ACME_CA_BUNDLE" placeholder:"FILE" help:"PEM file of roots trusted for the ACME server, beside the system's."`
	ACMEProfile      string        `name:"acme-profile" env:"CERTWORKER_ACME_PROFILE" placeholder:"NAME" help:"ACME profile name."`
	ACMEEABKid       string        `name:"acme-eab-kid" env:"CERTWORKER_ACME_EAB_KID" placeholder:"KID" help:"External account binding key id."`
	ACMEEABHMAC      string        `name:"acme-eab-hmac" env:"CERTWORKER_ACME_EAB_HMAC" placeholder:"KEY" help:"External account binding HMAC key (base64url)."`
	KeyType          string        `name:"key-type" env:"CERTWORKER_KEY_TYPE" default:"ec256" enum:"ec256,ec384,rsa2048,rsa4096" help:"Certificate key type: ec256, ec384, rsa2048 or rsa4096."`
	HTTP01Listen     string        `name:"http01-listen" env:"CERTWORKER_HTTP01_LISTEN" default:":80" placeholder:"ADDR" help:"HTTP-01 responder address; empty turns it off."`
	AdminListen      string        `name:"admin-listen" env:"CERTWORKER_ADMIN_LISTEN" default:"127.0.0.1:9090" placeholder:"ADDR" help:"Address of /healthz, /readyz and /metrics; empty turns it off."`
	Concurrency      int           `name:"concurrency" env:"CERTWORKER_CONCURRENCY" default:"4" help:"Orders in flight on this instance."`
	PollInterval     time.Duration `name:"poll-interval" env:"CERTWORKER_POLL_INTERVAL" default:"30s" help:"Safety-net pass interval."`
	RetryBase        time.Duration `name:"retry-base" env:"CERTWORKER_RETRY_BASE" default:"1m" help:"First gap between attempts, doubled on each failure."`
	RetryMax         time.Duration `name:"retry-max" env:"CERTWORKER_RETRY_MAX" default:"4h" help:"Longest gap between attempts."`
	MaxAttempts      int           `name:"max-attempts" env:"CERTWORKER_MAX_ATTEMPTS" default:"10" help:"Consecutive failures after which a domain is marked failed."`
	KeyEncryptionKey string        `name:"key-encryption-key" env:"CERTWORKER_KEY_ENCRYPTION_KEY" placeholder:"BASE64" help:"Base64 of 32 bytes; encrypts private keys at rest (AES-256-GCM)."`
	LogFormat        string        `name:"log-format" env:"CERTWORKER_LOG_FORMAT" default:"json" enum:"json,console" help:"Log encoder: json or console."`
	LogLevel         string        `name:"log-level" env:"CERTWORKER_LOG_LEVEL" default:"info" help:"Log level: debug, info, warn or error."`
	ShutdownGrace    time.Duration `name:"shutdown-grace" env:"CERTWORKER_SHUTDOWN_GRACE" default:"30s" help:"Time given to in-flight orders on SIGTERM."`
	Wake             string        `name:"wake" env:"CERTWORKER_WAKE" default:"notify" enum:"notify,logical" help:"How the worker hears that a domain is due: notify (LISTEN/NOTIFY, any server) or logical (a logical replication stream; needs wal_level = logical and a role with REPLICATION, and spares the proxy's commits NOTIFY's commit lock). Every instance on a database should use the same."`
}

// validate checks what the flag parser cannot.
func (c *runCmd) validate() error {
	switch {
	case c.Concurrency < 1:
		return usagef("--concurrency: must be at least 1, got %d", c.Concurrency)
	case c.PollInterval <= 0:
		return usagef("--poll-interval: must be positive, got %s", c.PollInterval)
	case c.RetryBase <= 0:
		return usagef("--retry-base: must be positive, got %s", c.RetryBase)
	case c.RetryMax < c.RetryBase:
		return usagef("--retry-max: %s is shorter than --retry-base %s", c.RetryMax, c.RetryBase)
	case c.MaxAttempts < 1:
		return usagef("--max-attempts: must be at least 1, got %d", c.MaxAttempts)
	case c.ShutdownGrace < 0:
		return usagef("--shutdown-grace: must not be negative, got %s", c.ShutdownGrace)
	}
	if _, err := zapcore.ParseLevel(c.LogLevel); err != nil {
		return usagef("--log-level: %q is not one of debug, info, warn, error", c.LogLevel)
	}
	for flag, addr := range map[string]string{"--http01-listen": c.HTTP01Listen, "--admin-listen": c.AdminListen} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return usagef("%s: %q is not host:port", flag, addr)
		}
	}
	return nil
}

func newLogger(format, level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	if format == "console" {
		cfg = zap.NewDevelopmentConfig()
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.Sampling = nil
	return cfg.Build()
}

func (c *runCmd) Run(g *globals) error {
	if err := c.validate(); err != nil {
		return err
	}
	kek, err := acme.ParseKeyEncryptionKey(c.KeyEncryptionKey)
	if err != nil {
		return usagef("%v", err)
	}
	log, err := newLogger(c.LogFormat, c.LogLevel)
	if err != nil {
		return usagef("--log-level: %v", err)
	}
	defer log.Sync() //nolint:errcheck
	// lego logs through a process-wide logger that acme points at zap.L().
	zap.ReplaceGlobals(log.Named("acme"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkConnection(ctx, pool, log); err != nil {
		return err
	}
	if pending, err := migrations.HasPending(ctx, stdlib.OpenDBFromPool(pool)); err != nil {
		return usagef("--database-url: %s", redact(err.Error(), c.DatabaseURL))
	} else if pending {
		return usagef("the database schema is not up to date: run `certworker migrate` first")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	issuer, err := acme.New(ctx, pool, log, acme.Config{
		DirectoryURL:     c.ACMEDirectory,
		Email:            c.ACMEEmail,
		CABundle:         c.ACMECABundle,
		Profile:          c.ACMEProfile,
		EABKeyID:         c.ACMEEABKid,
		EABHMAC:          c.ACMEEABHMAC,
		KeyType:          c.KeyType,
		KeyEncryptionKey: kek,
	})
	if err != nil {
		return usagef("%v", err)
	}

	var lst listener.Waker
	switch c.Wake {
	case listener.ModeLogical:
		lst = listener.NewLogical(pool, log, listener.Options{Registerer: reg})
	default:
		lst = listener.New(pool, log, listener.Options{Registerer: reg})
	}
	if err := lst.Start(ctx); err != nil {
		var se *listener.SetupError
		if errors.As(err, &se) {
			// Names settings, the role and the database, never the password; and
			// redacting a short password could mangle the setting's name.
			return usagef("%s", se.Error())
		}
		return usagef("--database-url: cannot listen for wake-ups: %s", redact(err.Error(), c.DatabaseURL))
	}
	defer lst.Stop()
	// Recorded once the waker is up, so that a --wake logical that cannot start
	// does not silence the trigger for the instances still on notify; and before
	// the first pass, which the waker's start-up wake-up triggers, so that pass
	// covers every change the old mode signalled and this one might not.
	if prev, err := listener.SetMode(ctx, pool, c.Wake); err != nil {
		return usagef("--wake %s: %s", c.Wake, redact(err.Error(), c.DatabaseURL))
	} else if prev != c.Wake {
		log.Warn("wake mode changed for every instance on this database; instances still running with the old mode wake only on their timer and poll until restarted with the new one",
			zap.String("from", prev), zap.String("to", c.Wake))
	}

	var responder *acme.Responder
	if c.HTTP01Listen != "" {
		responder = acme.NewResponder(pool, log, acme.ResponderOptions{Registerer: reg})
		if err := responder.Start(ctx); err != nil {
			return usagef("--database-url: %s", redact(err.Error(), c.DatabaseURL))
		}
		defer responder.Stop()
	}
	servers, err := c.serve(log, pool, lst, responder)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()
	if h, ok := servers["admin"]; ok {
		h.Handler.(*http.ServeMux).Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}

	q := queue.New(pool, queue.Config{RetryBase: c.RetryBase, RetryMax: c.RetryMax, MaxAttempts: c.MaxAttempts})
	fl := newFleet(q, issuer.DirectoryURL(), fleetInterval, log)
	reg.MustRegister(fl)
	fl.Start(ctx)
	defer fl.Stop()
	host, _ := os.Hostname()
	w := queue.NewWorker(q, issuer, lst.Wakes(), log, queue.WorkerConfig{
		Owner:         fmt.Sprintf("%s:%d", host, os.Getpid()),
		Concurrency:   c.Concurrency,
		PollInterval:  c.PollInterval,
		ShutdownGrace: c.ShutdownGrace,
		Directory:     issuer.DirectoryURL(),
	}, queue.NewMetrics(reg, q))
	return w.Run(ctx)
}

// serve starts the HTTP-01 responder and the admin endpoints. A listen error is a
// configuration error naming the flag.
func (c *runCmd) serve(log *zap.Logger, pool *pgxpool.Pool, lst listener.Waker, http01 http.Handler) (map[string]*http.Server, error) {
	servers := map[string]*http.Server{}
	start := func(name, flag, addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return usagef("%s: cannot listen on %s: %s", flag, addr, strings.TrimPrefix(err.Error(), "listen tcp "+addr+": "))
		}
		s := newServer(h)
		servers[name] = s
		log.Info("listening", zap.String("server", name), zap.String("addr", ln.Addr().String()))
		go func() {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("HTTP server stopped", zap.String("server", name), zap.Error(err))
			}
		}()
		return nil
	}
	if c.HTTP01Listen != "" {
		if err := start("http01", "--http01-listen", c.HTTP01Listen, http01); err != nil {
			return servers, err
		}
	}
	if c.AdminListen != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintln(w, "ok")
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			switch {
			case pool.Ping(ctx) != nil:
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "database unreachable")
			case !lst.Connected():
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, "listener not connected")
			default:
				fmt.Fprintln(w, "ready")
			}
		})
		if err := start("admin", "--admin-listen", c.AdminListen, mux); err != nil {
			return servers, err
		}
	}
	return servers, nil
}

// newServer is an HTTP server fit to face the internet, as the HTTP-01 responder does
// on port 80. A CA's validation request is one GET with a few hundred bytes of
// headers, answered at once: 5 s to send the headers and 10 s for the whole request
// end a slow client (slowloris) long before it matters, 10 s to write the answer is
// far beyond what a key authorization takes, an idle keep-alive connection is closed
// after 30 s, and 8 KiB of headers (Go allows 4 KiB more) is plenty for a CA and
// little for a flood.
func newServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    8 << 10,
	}
}
