package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/certworker/certworker"
	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/certstore/seal"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// letsEncrypt is the default --acme-directory.
const letsEncrypt = "https://acme-v02.api.letsencrypt.org/directory"

// runCmd's fields are in the order `run --help` lists them, by group (flagGroups), in
// the order an operator sets certworker up. caFlags, after fallbackFlags, adds its
// fields to the ends of the CA's and the second CA's groups.
type runCmd struct {
	dbFlags
	// ReplicationDatabaseURL lets the REPLICATION attribute
	// that --wake logical needs sit on a role of its own, holding no other right,
	// instead of on the role that writes the certificates (docs/security.md, "Least
	// privilege").
	ReplicationDatabaseURL string `name:"replication-database-url" env:"CERTWORKER_REPLICATION_DATABASE_URL" placeholder:"URL" group:"database" help:"With --wake logical: connection string of the replication connection, for a role of its own that holds REPLICATION, on the same database (default: --database-url)."`
	Wake                   string `name:"wake" env:"CERTWORKER_WAKE" default:"notify" enum:"notify,logical" group:"database" help:"How the worker hears that a domain is due: notify (LISTEN/NOTIFY, any server) or logical (a logical replication stream; needs wal_level = logical and a role with REPLICATION, and spares the proxy's commits NOTIFY's commit lock). Every instance on a database should use the same."`
	ACMEDirectory          string `name:"acme-directory" env:"CERTWORKER_ACME_DIRECTORY" default:"${le}" placeholder:"URL" group:"ca" help:"ACME directory URL."`
	ACMEEmail              string `name:"acme-email" env:"CERTWORKER_ACME_EMAIL" placeholder:"EMAIL" group:"ca" help:"ACME account contact."`
	ACMECABundle           string `name:"acme-ca-bundle" env:"CERTWORKER_ACME_CA_BUNDLE" placeholder:"FILE" group:"ca" help:"PEM file of roots trusted for the ACME server, beside the system's."`
	ACMEProfile            string `name:"acme-profile" env:"CERTWORKER_ACME_PROFILE" placeholder:"NAME" group:"ca" help:"ACME profile of the domains whose ssl_profile is NULL; run exits 2 when the CA's directory does not offer it. Empty: the CA's default (the order names none)."`
	KeyType                string `name:"key-type" env:"CERTWORKER_KEY_TYPE" default:"ec256" enum:"ec256,ec384,rsa2048,rsa4096" group:"ca" help:"Certificate key type: ec256, ec384, rsa2048 or rsa4096."`
	ACMEEABKid             string `name:"acme-eab-kid" env:"CERTWORKER_ACME_EAB_KID" placeholder:"KID" group:"ca" help:"External account binding key id."`
	ACMEEABHMAC            string `name:"acme-eab-hmac" env:"CERTWORKER_ACME_EAB_HMAC" placeholder:"KEY" group:"ca" help:"External account binding HMAC key (base64url)."`
	fallbackFlags
	caFlags
	LimitOrders          string        `name:"limit-orders-per-account" env:"CERTWORKER_LIMIT_ORDERS_PER_ACCOUNT" default:"300/3h" placeholder:"COUNT/DURATION" group:"limits" help:"Ledger limit on new orders from the ACME account, shared by every instance: COUNT/DURATION is a token bucket of COUNT refilled one every DURATION/COUNT, as the CA counts; or off (default: Let's Encrypt's, a burst of 300 then one every 36s)."`
	LimitRegistered      string        `name:"limit-certs-per-registered-domain" env:"CERTWORKER_LIMIT_CERTS_PER_REGISTERED_DOMAIN" default:"50/168h" placeholder:"COUNT/DURATION" group:"limits" help:"Ledger limit on new certificates per registered domain (public suffix list): a bucket of COUNT refilled one every DURATION/COUNT, or off."`
	LimitExactSet        string        `name:"limit-certs-per-exact-set" env:"CERTWORKER_LIMIT_CERTS_PER_EXACT_SET" default:"5/168h" placeholder:"COUNT/DURATION" group:"limits" help:"Ledger limit on certificates for one exact set of names (here: one name): a bucket of COUNT refilled one every DURATION/COUNT, or off."`
	LimitFailedAuthz     string        `name:"limit-failed-authz-per-name" env:"CERTWORKER_LIMIT_FAILED_AUTHZ_PER_NAME" default:"5/1h" placeholder:"COUNT/DURATION" group:"limits" help:"Ledger limit on failed authorizations per name: a bucket of COUNT refilled one every DURATION/COUNT, or off."`
	LimitTenantReserve   string        `name:"limit-tenant-reserve" env:"CERTWORKER_LIMIT_TENANT_RESERVE" default:"25%" group:"limits" placeholder:"PERCENT" help:"The share R of --limit-orders-per-account (at each CA) kept for the other tenants: a tenant that took R or more of its tokens in the last DURATION takes one only while the bucket holds more than R, so one tenant alone takes L-R at once, then the refill. 0 turns it off; at most 50%."`
	LimitConsecutive     string        `name:"limit-consecutive-failures" env:"CERTWORKER_LIMIT_CONSECUTIVE_FAILURES" default:"1152" placeholder:"COUNT" group:"limits" help:"Failed authorizations in a row for one name at the CA (a bucket of COUNT refilled one a day; a success fills it). At COUNT-1 the name is no longer ordered there, before the CA pauses it for the whole account: it goes to the second CA, or fails (too many failures). off turns it off."`
	ARIPerSecond         float64       `name:"ari-requests-per-second" env:"CERTWORKER_ARI_REQUESTS_PER_SECOND" default:"50" group:"limits" help:"Renewal-information (ARI) requests to the CA per second, for the whole fleet: the instances share one budget in the database. A million certificates at the CA's usual six hours between questions are 46 a second."`
	Concurrency          int           `name:"concurrency" env:"CERTWORKER_CONCURRENCY" default:"4" group:"limits" help:"Orders in flight on this instance."`
	MaxAttempts          int           `name:"max-attempts" env:"CERTWORKER_MAX_ATTEMPTS" default:"10" group:"limits" help:"Consecutive failures after which a domain is marked failed."`
	RetryBase            time.Duration `name:"retry-base" env:"CERTWORKER_RETRY_BASE" default:"1m" group:"limits" help:"First gap between attempts, doubled on each failure."`
	RetryMax             time.Duration `name:"retry-max" env:"CERTWORKER_RETRY_MAX" default:"4h" group:"limits" help:"Longest gap between attempts."`
	Preflight            string        `name:"preflight" env:"CERTWORKER_PREFLIGHT" default:"http" enum:"http,off" group:"preflight" help:"Before ordering, check that the name resolves and that http://NAME/.well-known/acme-challenge/PROBE reaches certworker, so that an order bound to fail is never sent (http), or not (off)."`
	PreflightResolver    string        `name:"preflight-resolver" env:"CERTWORKER_PREFLIGHT_RESOLVER" placeholder:"HOST:PORT" group:"preflight" help:"DNS server the preflight asks (default: the system's resolver)."`
	PreflightPort        int           `name:"preflight-port" env:"CERTWORKER_PREFLIGHT_PORT" default:"80" group:"preflight" help:"Port the preflight probes (where the CA validates HTTP-01)."`
	PreflightAllow       string        `name:"preflight-allow-cidr" env:"CERTWORKER_PREFLIGHT_ALLOW_CIDR" placeholder:"CIDR[,CIDR...]" group:"preflight" help:"Comma-separated ranges the preflight may connect to although they are reserved (loopback, private, link-local, CGNAT, multicast, NAT64...), for tests and private CAs. By default it connects to none of them."`
	DNSWaitMax           time.Duration `name:"dns-wait-max" env:"CERTWORKER_DNS_WAIT_MAX" default:"168h" group:"preflight" help:"How long a verified domain may wait for its DNS to point here (or for its DNS-01 CNAME) before it is marked failed."`
	DNSTarget            string        `name:"dns-target" env:"CERTWORKER_DNS_TARGET" placeholder:"HOST|ADDR[,ADDR...]" group:"preflight" help:"What tenants point their names at: a host name for a CNAME, or comma-separated addresses. Named in 'waiting for DNS:' errors, and a name whose answers do not match it waits without an HTTP probe."`
	DNS01Zone            string        `name:"dns01-zone" env:"CERTWORKER_DNS01_ZONE" placeholder:"ZONE" group:"preflight" help:"Zone this instance answers authoritatively for DNS-01 by delegation (tenants CNAME _acme-challenge.NAME to certworker_dns01_target(NAME)); empty: DNS-01 off, and wildcards are invalid names."`
	DNS01Listen          string        `name:"dns01-listen" env:"CERTWORKER_DNS01_LISTEN" default:":53" placeholder:"ADDR" group:"preflight" help:"UDP and TCP address of the --dns01-zone server."`
	DNS01Nameservers     string        `name:"dns01-nameservers" env:"CERTWORKER_DNS01_NAMESERVERS" placeholder:"NAME[=ADDR][,...]" group:"preflight" help:"The zone's name servers, served as its NS records and in its SOA; required with --dns01-zone. A name inside the zone takes its address (NAME=ADDR, once per address), which the zone then answers; without one, the parent zone must hold its glue (run warns)."`
	DNS01RateLimit       int           `name:"dns01-rate-limit" env:"CERTWORKER_DNS01_RATE_LIMIT" default:"20" group:"preflight" help:"UDP answers a second the --dns01-zone server sends to one source prefix (a /24 of IPv4, a /56 of IPv6); past it, answers are truncated or dropped (--dns01-rate-limit-slip), so that a forged source cannot turn the zone on a victim while real resolvers ask again over TCP, which is never limited. 0 turns the limit off. Behind a load balancer, it needs the clients' own addresses (docs/running.md)."`
	DNS01RateLimitSlip   int           `name:"dns01-rate-limit-slip" env:"CERTWORKER_DNS01_RATE_LIMIT_SLIP" default:"2" group:"preflight" help:"Of the answers past --dns01-rate-limit, one in this many goes out empty with TC set (the asker retries over TCP) and the others are dropped; 1 truncates them all, 0 drops them all."`
	DNS01RateLimitExempt string        `name:"dns01-rate-limit-exempt" env:"CERTWORKER_DNS01_RATE_LIMIT_EXEMPT" placeholder:"CIDR[,CIDR...]" group:"preflight" help:"Comma-separated source ranges that --dns01-rate-limit never limits (your own resolvers, monitoring)."`
	keyFlags
	HTTP01Listen   string        `name:"http01-listen" env:"CERTWORKER_HTTP01_LISTEN" default:":80" placeholder:"ADDR" empty:"off" group:"listeners" help:"HTTP-01 responder address; empty turns it off."`
	HTTP01MaxConns int           `name:"http01-max-connections" env:"CERTWORKER_HTTP01_MAX_CONNECTIONS" default:"4096" group:"listeners" help:"Connections the HTTP-01 responder holds open at most; at the cap a new one closes the one that has waited longest without a request being answered. At the default, a flood of 20,000 slow connections held the process at 132 MiB (docs/testing.md, Benchmarks)."`
	AdminListen    string        `name:"admin-listen" env:"CERTWORKER_ADMIN_LISTEN" default:"127.0.0.1:9090" placeholder:"ADDR" empty:"off" group:"listeners" help:"Address of /healthz, /readyz and /metrics; empty turns it off."`
	LogFormat      string        `name:"log-format" env:"CERTWORKER_LOG_FORMAT" default:"json" enum:"json,console" group:"logs" help:"Log encoder: json or console."`
	LogLevel       string        `name:"log-level" env:"CERTWORKER_LOG_LEVEL" default:"info" group:"logs" help:"Log level: debug, info, warn or error."`
	PollInterval   time.Duration `name:"poll-interval" env:"CERTWORKER_POLL_INTERVAL" default:"30s" group:"logs" help:"Safety-net pass interval."`
	OrderTimeout   time.Duration `name:"order-timeout" env:"CERTWORKER_ORDER_TIMEOUT" default:"10m" group:"logs" help:"An order running longer is cancelled and charged as a failure."`
	ShutdownGrace  time.Duration `name:"shutdown-grace" env:"CERTWORKER_SHUTDOWN_GRACE" default:"30s" group:"logs" help:"Time given to in-flight orders on SIGTERM."`
	// Lease is hidden: the claim's lease, for tests that stop the database for longer
	// than it without waiting minutes.
	Lease time.Duration `name:"lease" env:"CERTWORKER_LEASE" default:"60s" hidden:"" group:"logs" help:"Claim lease (tests only)."`
}

// Help is the text `run --help` prints above the flags.
func (c *runCmd) Help() string {
	return "The flags are grouped in the order an operator sets certworker up. docs/reference.md lists every flag, endpoint, log field and metric."
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
	case c.OrderTimeout <= 0:
		return usagef("--order-timeout: must be positive, got %s", c.OrderTimeout)
	case c.HTTP01MaxConns < 1:
		return usagef("--http01-max-connections: must be at least 1, got %d", c.HTTP01MaxConns)
	case !(c.ARIPerSecond > 0) || math.IsInf(c.ARIPerSecond, 0):
		return usagef("--ari-requests-per-second: must be a positive number, got %v", c.ARIPerSecond)
	case c.Lease < 3*time.Second:
		return usagef("--lease: must be at least 3s, got %s", c.Lease)
	}
	if _, err := c.limits(); err != nil {
		return err
	}
	if err := c.validateFallback(); err != nil {
		return err
	}
	if _, err := c.replication(); err != nil {
		return err
	}
	if err := c.validateDNS(); err != nil {
		return err
	}
	if _, err := acme.ParseAllowCIDR(c.PreflightAllow); err != nil {
		return usagef("%v", err)
	}
	if err := c.caFlags.validate(c.ACMEEABHMAC); err != nil {
		return err
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
	keks, err := c.keyring()
	if err != nil {
		return err
	}
	log, err := newLogger(c.LogFormat, c.LogLevel)
	if err != nil {
		return usagef("--log-level: %v", err)
	}
	defer log.Sync() //nolint:errcheck
	// lego logs through a process-wide logger that acme points at zap.L().
	zap.ReplaceGlobals(log.Named("acme"))

	// Both addresses are bound before anything else: a port already taken is a
	// configuration error found before the worker places an order, and the HTTP-01
	// responder answers before the first order's validation can arrive (a worker that
	// ordered before its responder listened would have the CA's validations refused,
	// and each refusal counts against the failed-validation limit).
	lns, err := c.listen()
	if err != nil {
		return err
	}
	defer lns.close()
	dnsSocks, err := c.listenDNS01()
	if err != nil {
		return err
	}
	defer dnsSocks.close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	pool, err := c.open(ctx, log)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newBuildInfo())

	limits, err := c.limits()
	if err != nil {
		return err
	}
	logKeys(log, reg, keks)
	issuer, err := c.issuer(ctx, pool, log, keks)
	if err != nil {
		return err
	}
	if err := checkAccountKey(ctx, issuer, c.DatabaseURL); err != nil {
		return err
	}
	if err := checkEAB(ctx, issuer, log, c.DatabaseURL, eabFlags); err != nil {
		return err
	}
	if err := checkProfile(ctx, issuer, log); err != nil {
		return err
	}
	second, secondIssuer, err := c.fallback(ctx, pool, log, keks, limits)
	if err != nil {
		return err
	}

	var responder *acme.Responder
	if _, ok := lns["http01"]; ok {
		// Its tokens are held in memory once the worker's listening connection,
		// which carries it as a topic, is up (worker.Config.Topics).
		responder = acme.NewResponder(pool, log, acme.ResponderOptions{Registerer: reg})
	}
	if err := queue.New(pool, issuing.DefaultConfig()).RecordDNS01Zone(ctx, c.DNS01Zone); err != nil {
		return err
	}
	if err := queue.New(pool, issuing.DefaultConfig()).RecordDNSTarget(ctx, c.DNSTarget); err != nil {
		return err
	}
	dnsServer, err := c.serveDNS01(dnsSocks, pool, log, reg)
	if err != nil {
		return err
	}
	if dnsServer != nil {
		defer dnsServer.Shutdown()
	}
	// /readyz's session, made when a probe first comes; closed once the servers are.
	probes := newProbeSession(pool, c.Lease)
	defer probes.Close()
	// The servers are shut down first (deferred last), the responder after them.
	var servers []*http.Server
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()
	if responder != nil {
		servers = append(servers, serveResponder(log, lns["http01"], responder, c.HTTP01MaxConns, reg))
	}

	issuers := []*acme.Issuer{issuer}
	if secondIssuer != nil {
		issuers = append(issuers, secondIssuer)
	}
	caa, err := c.caaCheck(issuers...)
	if err != nil {
		return err
	}
	topics := map[string]listener.Topic{}
	if responder != nil {
		topics[acme.TokenChannel] = responder
	}
	w, err := c.startWorker(ctx, pool, issuer, log, reg, limits, second, caa, topics)
	if err != nil {
		return err
	}

	fl := newFleet(queue.New(pool, issuing.DefaultConfig()), issuer.DirectoryURL(), w.Owner(), fleetInterval, log)
	reg.MustRegister(fl)
	fl.Start(ctx)
	defer fl.Stop()
	if ln, ok := lns["admin"]; ok {
		servers = append(servers, serve(log, "admin", ln, adminMux(probes, w, issuer, secondIssuer, reg)))
	}
	return w.Wait()
}

// queueConfig is the queue's configuration as the worker will have it, for warming
// up the pool's sessions (queue.WorkerSessionFor): the worker sets Fallback from its
// second CA the same way.
func (c *runCmd) queueConfig() issuing.Config {
	qc := issuing.Config{RetryBase: c.RetryBase, RetryMax: c.RetryMax, MaxAttempts: c.MaxAttempts, Lease: c.Lease}
	if c.FallbackDirectory != "" {
		qc.Fallback = &issuing.Fallback{Directory: c.FallbackDirectory, After: c.FallbackAfter}
	}
	return qc
}

// open connects to the database, with the worker's session bounds for --lease, and
// checks what run needs of it: a connection LISTEN works on (not a transaction
// pooler) and a schema migrated to this version.
func (c *runCmd) open(ctx context.Context, log *zap.Logger) (*pgxpool.Pool, error) {
	pool, err := c.connectWith(ctx, queue.WorkerSessionFor(c.queueConfig(), c.ACMEDirectory))
	if err != nil {
		return nil, err
	}
	if err := checkConnection(ctx, pool, log); err != nil {
		pool.Close()
		return nil, err
	}
	db := stdlib.OpenDBFromPool(pool)
	if err := migrations.Check(ctx, db); err != nil {
		pool.Close()
		return nil, schemaError(err, c.DatabaseURL)
	}
	// Within the window the schema may be the next release's: worth a line, since
	// the operator is between the two steps of an upgrade or has rolled back.
	if rec, err := migrations.ReadRelease(ctx, db); err == nil && rec != nil && rec.Release != certworker.Version() {
		log.Info("the database schema was migrated by another release, which serves this one",
			zap.String("release", certworker.Version()), zap.String("schema_release", rec.Release))
	}
	return pool, nil
}

// issuer registers (or loads) the ACME account and returns the issuer.
func (c *runCmd) issuer(ctx context.Context, pool *pgxpool.Pool, log *zap.Logger, keks seal.Keyring) (*acme.Issuer, error) {
	hmac, err := c.eabHMAC(c.ACMEEABHMAC)
	if err != nil {
		return nil, err
	}
	caaIDs, err := c.caaIdentities()
	if err != nil {
		return nil, err
	}
	issuer, err := acme.New(ctx, pool, log, acme.Config{Recorder: queue.New(pool, issuing.DefaultConfig()),
		DirectoryURL:         c.ACMEDirectory,
		Email:                c.ACMEEmail,
		CABundle:             c.ACMECABundle,
		Profile:              c.ACMEProfile,
		EABKeyID:             c.ACMEEABKid,
		EABHMAC:              hmac,
		CAAIdentities:        caaIDs,
		KeyType:              c.KeyType,
		KeyEncryptionKeys:    keks,
		Preflight:            c.Preflight,
		PreflightResolver:    c.PreflightResolver,
		PreflightPort:        c.PreflightPort,
		PreflightAllowCIDR:   c.PreflightAllow,
		RenewalInfoPerSecond: c.ARIPerSecond,
		DNS01Zone:            c.DNS01Zone,
		DNSTarget:            c.DNSTarget,
	})
	if err != nil {
		return nil, usagef("%v", err)
	}
	return issuer, nil
}

// replication is the configuration of --wake logical's replication connection from
// --replication-database-url, or nil for --database-url's. It must name the database
// the worker claims from: a slot on another would never wake it.
func (c *runCmd) replication() (*pgconn.Config, error) {
	if c.ReplicationDatabaseURL == "" {
		return nil, nil
	}
	if c.Wake != issuing.WakeLogical {
		return nil, usagef("--replication-database-url: only --wake logical opens a replication connection (--wake is %s)", c.Wake)
	}
	cfg, err := pgconn.ParseConfig(c.ReplicationDatabaseURL)
	if err != nil {
		return nil, usagef("--replication-database-url: %s", redact(err.Error(), c.ReplicationDatabaseURL))
	}
	if main, err := pgconn.ParseConfig(c.DatabaseURL); err == nil && main.Database != cfg.Database {
		return nil, usagef("--replication-database-url: names database %q and --database-url %q: the replication connection must read the database the worker claims from",
			cfg.Database, main.Database)
	}
	return cfg, nil
}

// startWorker starts the worker: its listener connects, and it claims from then on.
func (c *runCmd) startWorker(ctx context.Context, pool *pgxpool.Pool, issuer *acme.Issuer, log *zap.Logger, reg prometheus.Registerer, limits issuing.Limits, second *worker.FallbackCA, caa worker.CAAFunc, topics map[string]listener.Topic) (*worker.Worker, error) {
	replication, err := c.replication()
	if err != nil {
		return nil, err
	}
	w, err := worker.New(worker.Config{
		Pool:          pool,
		Issuer:        issuer,
		Log:           log,
		Registerer:    reg,
		Wake:          c.Wake,
		WakeOptions:   listener.Options{Replication: replication},
		Topics:        topics,
		Owner:         owner(),
		Directory:     issuer.DirectoryURL(),
		Queue:         issuing.Config{RetryBase: c.RetryBase, RetryMax: c.RetryMax, MaxAttempts: c.MaxAttempts, Lease: c.Lease},
		Limits:        limits,
		Wildcards:     c.DNS01Zone != "",
		DNSWaitMax:    c.DNSWaitMax,
		Fallback:      second,
		CAA:           caa,
		Concurrency:   c.Concurrency,
		PollInterval:  c.PollInterval,
		ShutdownGrace: max(c.ShutdownGrace, time.Nanosecond), // 0 would mean the default
		OrderTimeout:  c.OrderTimeout,

		RenewalInfoPerSecond: c.ARIPerSecond,
	})
	if err != nil {
		return nil, usagef("%v", err)
	}
	if err := w.Start(ctx); err != nil {
		var se *listener.SetupError
		if errors.As(err, &se) {
			// Names settings, the role and the database, never the password; and
			// redacting a short password could mangle the setting's name.
			return nil, usagef("%s", se.Error())
		}
		flag := "--database-url"
		if replication != nil {
			flag = "--database-url or --replication-database-url"
		}
		return nil, usagef("%s: cannot start the worker: %s", flag,
			redact(redact(err.Error(), c.DatabaseURL), c.ReplicationDatabaseURL))
	}
	return w, nil
}

// owner is this instance's name in ssl_claimed_by: host and pid (the worker adds a
// random suffix).
func owner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// limits reads the --limit-* flags.
func (c *runCmd) limits() (issuing.Limits, error) {
	var l issuing.Limits
	for _, f := range []struct {
		flag, value string
		into        *issuing.Limit
	}{
		{"--limit-orders-per-account", c.LimitOrders, &l.OrdersPerAccount},
		{"--limit-certs-per-registered-domain", c.LimitRegistered, &l.CertsPerRegisteredDomain},
		{"--limit-certs-per-exact-set", c.LimitExactSet, &l.CertsPerExactSet},
		{"--limit-failed-authz-per-name", c.LimitFailedAuthz, &l.FailedAuthzPerName},
	} {
		v, err := issuing.ParseLimit(f.value)
		if err != nil {
			return l, usagef("%s: %v", f.flag, err)
		}
		*f.into = v
	}
	cf, err := issuing.ParseConsecutiveFailures(c.LimitConsecutive)
	if err != nil {
		return l, usagef("--limit-consecutive-failures: %v", err)
	}
	l.ConsecutiveFailures = cf
	r, err := issuing.ParseTenantReserve(c.LimitTenantReserve)
	if err != nil {
		return l, usagef("--limit-tenant-reserve: %v", err)
	}
	l.TenantReserve = r
	return l, nil
}

// listen binds the addresses of --http01-listen and --admin-listen (those not
// empty). A listen error is a configuration error naming the flag.
func (c *runCmd) listen() (listeners, error) {
	lns := listeners{}
	for _, l := range []struct{ name, flag, addr string }{
		{"http01", "--http01-listen", c.HTTP01Listen},
		{"admin", "--admin-listen", c.AdminListen},
	} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			lns.close()
			return nil, usagef("%s: cannot listen on %s: %s", l.flag, l.addr, strings.TrimPrefix(err.Error(), "listen tcp "+l.addr+": "))
		}
		lns[l.name] = ln
	}
	return lns, nil
}

// listeners are the bound sockets of run's HTTP servers, by server name.
type listeners map[string]net.Listener

// close closes the sockets; one a server already closed is closed again harmlessly.
func (lns listeners) close() {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// serveResponder serves the HTTP-01 responder on ln. It faces the internet, so its
// connections are capped (acme.ConnLimiter, --http01-max-connections): a flood of
// held connections cannot take the process's memory.
func serveResponder(log *zap.Logger, ln net.Listener, responder http.Handler, maxConns int, reg prometheus.Registerer) *http.Server {
	limiter := acme.NewConnLimiter(ln, maxConns, reg)
	return serve(log, "http01", limiter, responder, limiter.Wrap)
}

// serve answers on ln with h until the server is shut down. configure, if any,
// adjusts the server before it starts.
func serve(log *zap.Logger, name string, ln net.Listener, h http.Handler, configure ...func(*http.Server)) *http.Server {
	s := newServer(h)
	for _, f := range configure {
		f(s)
	}
	log.Info("listening", zap.String("server", name), zap.String("addr", ln.Addr().String()))
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server stopped", zap.String("server", name), zap.Error(err))
		}
	}()
	return s
}

// adminMux serves /healthz (the process is alive), /readyz (the database answers on
// probes, the session of its own, the worker's listener is connected, and the
// configured keys open the stored ACME account key) and /metrics.
func adminMux(probes *probeSession, wk *worker.Worker, issuer, second *acme.Issuer, reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	ready := newReadiness(func(ctx context.Context) string { return notReady(ctx, probes, wk, issuer, second) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if why := ready.check(r.Context()); why != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, why)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
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
