package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// connect opens a pool on the flag's URL with the worker's sessions at the default
// lease (queue.ConfigurePool): the commands' statements are bounded as the worker's
// are. See connectWith.
func (f dbFlags) connect(ctx context.Context) (*pgxpool.Pool, error) {
	return f.connectWith(ctx, queue.WorkerSession(issuing.DefaultLease))
}

// connectWith opens a pool on the flag's URL, with sessions set up as s says, and
// checks that the server answers. Every error is one line without the password: a
// configuration error (exit 2) when the URL is missing or malformed or the server
// refuses what it names (refusedByServer), a failure (exit 1) when the server cannot
// be reached.
// idlePingTimeout: a live server answers a ping in milliseconds, a loaded one in far
// less than a second.
const idlePingTimeout = time.Second

func (f dbFlags) connectWith(ctx context.Context, s queue.Session) (*pgxpool.Pool, error) {
	if f.DatabaseURL == "" {
		return nil, usagef("--database-url is required (or CERTWORKER_DATABASE_URL, or DATABASE_URL)")
	}
	cfg, err := pgxpool.ParseConfig(f.DatabaseURL)
	if err != nil {
		return nil, usagef("--database-url: %s", redact(err.Error(), f.DatabaseURL))
	}
	// Also bounds the connection to each host (queue.HostConnectTimeout).
	queue.ConfigureSession(cfg, s)
	// An idle connection is pinged before use; one to a server that went silent (a
	// primary that failed over) is given up after idlePingTimeout, not after the
	// caller's whole deadline, so that the next one, or a new connection to the new
	// primary, is tried in time.
	cfg.PingTimeout = idlePingTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, usagef("--database-url: %s", redact(err.Error(), f.DatabaseURL))
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		msg := fmt.Sprintf("--database-url: cannot connect to %s: %s", describe(cfg.ConnConfig.Config), redact(rootCause(err), f.DatabaseURL))
		if refusedByServer(err) {
			return nil, &usageError{msg}
		}
		return nil, &failedError{msg}
	}
	return pool, nil
}

// refusedByServer tells a connection the server refused for what the URL says (a
// wrong password, a role or database that does not exist, a host that does not let
// the role in: the operator's configuration, exit 2) from one that did not get that
// far (nothing listening, no route, a timeout, a server starting or shutting down: a
// failure, exit 1, which trying again may mend).
func refusedByServer(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "28000", // invalid_authorization_specification (pg_hba.conf lets the role in nowhere)
		"28P01", // invalid_password
		"3D000", // invalid_catalog_name (no such database)
		"42501": // insufficient_privilege (no CONNECT on the database)
		return true
	}
	return false
}

// describe names a server without its credentials.
func describe(c pgconn.Config) string {
	return c.User + "@" + c.Host + ":" + strconv.Itoa(int(c.Port)) + "/" + c.Database
}

func rootCause(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message
	}
	// pgconn joins one error per address and TLS mode tried; the innermost cause of
	// the first says what went wrong.
	for {
		var next error
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				next = errs[0]
			}
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		}
		if next == nil {
			return err.Error()
		}
		if errors.As(next, &pgErr) {
			return pgErr.Message
		}
		err = next
	}
}

var passwordKV = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// redact removes the connection string's password from a message, whatever form the
// connection string took.
func redact(msg, dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
			msg = strings.ReplaceAll(msg, url.QueryEscape(p), "xxxxx")
		}
	}
	for _, m := range passwordKV.FindAllStringSubmatch(dsn, -1) {
		p := strings.Trim(m[2], "'")
		if p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, "xxxxx")
	}
	return passwordKV.ReplaceAllString(msg, "${1}xxxxx")
}
