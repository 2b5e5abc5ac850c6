package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/certworker/certworker/migrations"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

type migrateCmd struct {
	dbFlags
	LockTimeout time.Duration `name:"lock-timeout" default:"2s" env:"CERTWORKER_LOCK_TIMEOUT" group:"database" help:"Longest any statement waits for a lock on the proxy's tables before it gives up and is retried with backoff: the longest a proxy write waits behind migrate (also CERTWORKER_LOCK_TIMEOUT)."`
}

func (c *migrateCmd) Run(g *globals) error {
	if c.LockTimeout <= 0 {
		return usagef("--lock-timeout must be positive, got %s", c.LockTimeout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	results, err := migrations.Up(ctx, db, migrations.Options{
		LockTimeout: c.LockTimeout,
		OnRetry: func(r migrations.Retry) {
			fmt.Fprintf(g.stderr, "certworker: a statement gave up waiting for a lock after %s (%s); retrying in %s (attempt %d)\n",
				c.LockTimeout, oneLine(redact(r.Err.Error(), c.DatabaseURL)), r.Wait.Round(time.Millisecond), r.Attempt+1)
		},
		OnNotice: func(s string) { fmt.Fprintf(g.stderr, "certworker: %s\n", s) },
	})
	for _, r := range results {
		fmt.Fprintf(g.stdout, "applied %s (%s)\n", r.Source, r.Duration)
	}
	// A newer release migrated the database (a rollback, or an old pod's Job run
	// again): nothing to do, and not a failure.
	var newer *migrations.NewerError
	if errors.As(err, &newer) {
		fmt.Fprintln(g.stdout, newer.Error())
		return nil
	}
	if err != nil {
		return &failedError{redact(err.Error(), c.DatabaseURL)}
	}
	if len(results) == 0 {
		fmt.Fprintln(g.stdout, "database schema is up to date")
	}
	return nil
}

// schemaError is run's refusal to start on a database whose schema does not match
// this binary (exit 2): behind it (run migrate), past its window (a release that no
// longer serves it migrated it) or ahead of it with no record of serving it, or
// unreadable (the flag to look at).
func schemaError(err error, databaseURL string) error {
	var behind *migrations.BehindError
	var ahead *migrations.AheadError
	var window *migrations.WindowError
	var functions *migrations.FunctionsError
	if errors.As(err, &behind) || errors.As(err, &ahead) || errors.As(err, &window) || errors.As(err, &functions) {
		return usagef("%s", err)
	}
	return usagef("--database-url: %s", redact(err.Error(), databaseURL))
}

type statusCmd struct {
	dbFlags
	JSON   bool   `name:"json" env:"CERTWORKER_JSON" help:"Print one JSON object instead of a table."`
	Tenant string `name:"tenant" env:"CERTWORKER_TENANT" placeholder:"ID" group:"selection" help:"Only this tenant's domains (its id); with DOMAIN, a domain of another tenant is unknown."`
	Limit  int    `name:"limit" env:"CERTWORKER_LIMIT" default:"0" placeholder:"N" group:"selection" help:"List at most N domains; with DOMAIN, show its N newest events. 0: all."`
	Domain string `arg:"" optional:"" help:"Show this domain's whole state, its certificate and its history."`
}

// domainReport is what `status DOMAIN` shows: the domain's whole state, its state as
// the proxy shows it to the tenant (certworker_domain_status), and its history, newest
// first.
type domainReport struct {
	*queue.DomainState
	State       string        `json:"state"`
	Reason      *string       `json:"reason"`
	NextCheckAt *time.Time    `json:"next_check_at"`
	PointTo     string        `json:"point_to"`
	CNAMETarget *string       `json:"cname_target"`
	Events      []queue.Event `json:"events"`
}

func (c *statusCmd) Run(g *globals) error {
	if c.Tenant != "" {
		if _, err := uuid.Parse(c.Tenant); err != nil {
			return usagef("--tenant: %q is not a tenant id (a UUID)", c.Tenant)
		}
	}
	if c.Limit < 0 {
		return usagef("--limit must be 0 (all) or more, got %d", c.Limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := queue.New(pool, issuing.DefaultConfig())
	if c.Domain != "" {
		r, err := c.report(ctx, q)
		if err != nil {
			return err
		}
		if c.JSON {
			return writeJSON(g, r)
		}
		printState(g, r)
		return nil
	}
	o, err := q.OverviewOf(ctx, c.Tenant, c.Limit)
	if err != nil {
		return &failedError{err.Error()}
	}
	if c.JSON {
		return writeJSON(g, o)
	}
	fmt.Fprintf(g.stdout, "pending %d  provisioning %d  active %d  failed %d\n",
		o.Counts.Pending, o.Counts.Provisioning, o.Counts.Active, o.Counts.Failed)
	fmt.Fprintln(g.stdout, replaceLine(o.Replace))
	tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
	if len(o.Pauses) > 0 {
		fmt.Fprintln(tw, "\nPAUSED\tKEY\tBY\tUNTIL\tCA\tREASON")
		for _, p := range o.Pauses {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Scope, shown(p.Key), p.Source, p.PausedUntil.UTC().Format(time.RFC3339),
				shown(pauseCA(p)), shown(p.Reason))
		}
	}
	if len(o.Profiles) > 0 {
		fmt.Fprintln(tw, "\nPROFILE\tDOMAINS\tREFUSED BY THE CA")
		for _, p := range o.Profiles {
			fmt.Fprintf(tw, "%s\t%d\t%d\n", shown(p.Profile), p.Domains, p.Refused)
		}
	}
	if len(o.Issuers) > 0 {
		fmt.Fprintln(tw, "\nISSUED BY\tCERTIFICATES")
		for _, c := range o.Issuers {
			dir := c.Directory
			if dir == "" {
				dir = "(not recorded)"
			}
			fmt.Fprintf(tw, "%s\t%d\n", shown(dir), c.Certificates)
		}
	}
	if len(o.Domains) > 0 {
		fmt.Fprintln(tw, "\nDOMAIN\tSTATUS\tATTEMPTS\tNEXT ATTEMPT\tPROFILE\tCERT PROFILE\tLAST ERROR OR PAUSE")
		for _, d := range o.Domains {
			why := str(d.SSLError)
			if d.PauseReason != nil {
				why = "paused: " + *d.PauseReason
			}
			next := when(d.NextAttempt, "waits for retry")
			if d.SSLStatus == "active" {
				next = "-" // renewing under its certificate's profile, on its own schedule
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", shown(d.Domain), shown(d.SSLStatus), d.SSLAttempts,
				next, shown(profileOf(d.Profile)), shown(str(d.CertificateProfile)), shown(why))
		}
	}
	return tw.Flush()
}

// report reads what `status DOMAIN` shows.
func (c *statusCmd) report(ctx context.Context, q *queue.Queue) (*domainReport, error) {
	s, err := q.State(ctx, c.Domain)
	if errors.Is(err, issuing.ErrNotFound) || (err == nil && c.Tenant != "" && !strings.EqualFold(s.TenantID, c.Tenant)) {
		return nil, &failedError{fmt.Sprintf("%s: unknown domain", c.Domain)}
	}
	if err != nil {
		return nil, &failedError{err.Error()}
	}
	r := &domainReport{DomainState: s, Events: []queue.Event{}}
	st, err := q.DomainStatus(ctx, s.ID, s.TenantID)
	if err != nil {
		return nil, &failedError{err.Error()}
	}
	if st != nil {
		r.State, r.Reason, r.NextCheckAt, r.PointTo, r.CNAMETarget = st.State, st.Reason, st.NextCheckAt, st.PointTo, st.CNAMETarget
	}
	limit := c.Limit
	if limit == 0 {
		limit = queue.EventsPerDomain
	}
	if r.Events, err = q.Events(ctx, s.ID, s.TenantID, limit); err != nil {
		return nil, &failedError{err.Error()}
	}
	return r, nil
}

// replaceLine is status's line on the certificates whose renewal window has started (a
// mass revocation, or its rehearsal): "replace now: N, at the current pace done by T".
func replaceLine(p issuing.ReplaceProgress) string {
	line := fmt.Sprintf("replace now: %d, at the current pace done by ", p.Due)
	var notes []string
	if p.DoneBy == nil {
		line += "never"
		notes = append(notes, fmt.Sprintf("none replaced in the last %s", issuing.ReplacePaceWindow))
	} else {
		line += p.DoneBy.UTC().Format(time.RFC3339)
		if p.Due > 0 {
			notes = append(notes, fmt.Sprintf("%d replaced in the last %s", p.Replaced, issuing.ReplacePaceWindow))
		}
	}
	if p.Due > 0 && p.EarliestExpiry != nil {
		notes = append(notes, "the first expires "+p.EarliestExpiry.UTC().Format(time.RFC3339))
	}
	if len(notes) > 0 {
		line += " (" + strings.Join(notes, "; ") + ")"
	}
	if p.Late() {
		line += "; LATE: certificates expire before they are replaced"
	}
	return line
}

// profileOf shows a domain's ssl_profile: NULL is the worker's --acme-profile.
func profileOf(p *string) string {
	if p == nil {
		return "(--acme-profile)"
	}
	return *p
}

func printState(g *globals, r *domainReport) {
	s := r.DomainState
	tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
	// Every value is shown escaped: most are the tenant's, or quote it.
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, shown(v)) }
	row("domain", s.Domain)
	row("domain_id", s.ID)
	row("tenant_id", s.TenantID)
	row("verification", s.VerificationStatus)
	row("provider", s.SSLProvider)
	row("ssl_status", s.SSLStatus)
	row("state", r.State)
	row("reason", str(r.Reason))
	row("next check", when(r.NextCheckAt, "-"))
	row("attempts", fmt.Sprint(s.SSLAttempts))
	row("last error", str(s.SSLError))
	row("last attempt", when(s.LastAttempt, "never"))
	row("next attempt", when(s.NextAttempt, "-"))
	if s.PausedUntil != nil {
		row("paused until", when(s.PausedUntil, "-"))
		row("pause reason", str(s.PauseReason))
	}
	row("profile", profileOf(s.Profile))
	if s.ProfileRefused != nil {
		row("profile refused by the CA", *s.ProfileRefused)
	}
	row("expires", when(s.ExpiresAt, "-"))
	if s.CADirectory != nil {
		ca := *s.CADirectory
		if s.CACause != nil {
			ca += " (second CA: " + *s.CACause + ")"
		}
		row("last claim's CA", ca)
	}
	if s.CARefused != nil {
		row("refused by the CA", *s.CARefused)
	}
	if s.Challenge != nil {
		row("challenge", *s.Challenge+" ("+str(s.ChallengeReason)+")")
	}
	if s.ClaimedBy != nil {
		row("claimed by", *s.ClaimedBy+" (lease until "+when(s.LeaseExpiresAt, "?")+")")
	}
	if c := s.Certificate; c != nil {
		row("certificate issuer", str(c.Issuer))
		row("issued by the CA", str(c.Directory))
		row("certificate serial", str(c.Serial))
		row("not before", when(c.NotBefore, "-"))
		notAfter := "unknown (no expires_at, and certificate_pem cannot be read)"
		if !c.NotAfter.IsZero() {
			notAfter = c.NotAfter.UTC().Format(time.RFC3339)
		}
		row("not after", notAfter)
		row("renewal time", when(c.RenewAt, "not yet known (worked out on the next pass)"))
		row("auto renew", fmt.Sprint(c.AutoRenew))
		profile := "none recorded (matches any)"
		if c.Profile != nil {
			profile = *c.Profile
		}
		row("certificate profile", profile)
	} else {
		row("certificate", "none stored")
	}
	tw.Flush()
	printEvents(g, r.Events)
}

// printEvents ends `status DOMAIN` with the domain's history, newest first, as
// `kubectl describe` ends with a resource's events.
func printEvents(g *globals, events []queue.Event) {
	if len(events) == 0 {
		fmt.Fprintln(g.stdout, "\nEvents: <none>")
		return
	}
	fmt.Fprintln(g.stdout, "\nEvents:")
	tw := tabwriter.NewWriter(g.stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  LAST SEEN\tFIRST SEEN\tCOUNT\tEVENT\tREASON\tMESSAGE")
	for _, e := range events {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\n", e.LastAt.UTC().Format(time.RFC3339), e.At.UTC().Format(time.RFC3339),
			e.Count, shown(e.Event), shown(str(e.Reason)), shown(str(e.Message)))
	}
	tw.Flush()
}

func when(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}

func str(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

// writeJSON prints v as indented JSON. encoding/json escapes control characters; the
// format characters it leaves (a bidirectional override, a zero-width space) are
// escaped too, as \uXXXX, which reads back as the same string: they can only stand
// inside a JSON string, where that escape means them.
func writeJSON(g *globals, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	out := buf.String()
	if strings.IndexFunc(out, func(r rune) bool { return r != '\n' && needsEscape(r) }) >= 0 {
		var b strings.Builder
		for _, r := range out {
			if r != '\n' && needsEscape(r) {
				if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
					fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
				} else {
					fmt.Fprintf(&b, `\u%04x`, r)
				}
				continue
			}
			b.WriteRune(r)
		}
		out = b.String()
	}
	_, err := io.WriteString(g.stdout, out)
	return err
}

type retryCmd struct {
	dbFlags
	Domain string `arg:"" help:"The domain to put back in the queue."`
}

func (c *retryCmd) Run(g *globals) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := queue.New(pool, issuing.DefaultConfig())
	if err := q.Retry(ctx, c.Domain); err != nil {
		var refused *queue.RefusedError
		if errors.As(err, &refused) {
			return &failedError{"refused: " + refused.Reason}
		}
		var ambiguous *queue.AmbiguousError
		if errors.As(err, &ambiguous) {
			return &failedError{"refused: " + ambiguous.Error()}
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			// The workers' role of deploy/grants.sql: certworker_queue_for_issuance
			// returns whole proxy_domains rows, and that role may read only the
			// columns `run` uses.
			return &failedError{fmt.Sprintf("%v; retry runs the proxy's own operation "+
				"(certworker_queue_for_issuance), which needs the proxy's rights on proxy_domains: "+
				"give --database-url the proxy's role or the tables' owner", err)}
		}
		return &failedError{err.Error()}
	}
	fmt.Fprintf(g.stdout, "%s: queued for issuance\n", c.Domain)
	return nil
}

type versionCmd struct{}

func (versionCmd) Run(g *globals) error {
	fmt.Fprintln(g.stdout, versionLine())
	return nil
}
