package acme

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/go-acme/lego/v4/challenge/http01"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Preflight modes (Config.Preflight, --preflight).
const (
	// PreflightHTTP checks, before ordering, what the CA's HTTP-01 validation will
	// see: that the name resolves, and that a probe token stored like a challenge's
	// comes back from http://NAME/.well-known/acme-challenge/TOKEN.
	PreflightHTTP = "http"
	// PreflightOff orders without checking.
	PreflightOff = "off"
)

const (
	// DefaultPreflightPort is where HTTP-01 validation connects (RFC 8555 §8.3).
	DefaultPreflightPort = 80

	// preflightTimeout bounds the whole check, DNS and HTTP with its redirects. A
	// server that needs longer to answer a 43-byte file is unlikely to pass the
	// CA's validation either, and a hung probe must not hold one of the worker's
	// --concurrency slots for long.
	preflightTimeout = 10 * time.Second

	// dnsTimeout bounds one DNS lookup, well inside preflightTimeout, so that
	// a resolver that does not answer is told from a name that does not resolve
	// (Go's resolver waits 5 s a try by default).
	dnsTimeout = 4 * time.Second

	// probeTTL is how long a probe token is served if its instance dies before
	// deleting it; a probe takes at most preflightTimeout.
	probeTTL = time.Minute

	// The CA's rules for following a validation's redirects, from Boulder's VA
	// (va/http.go): at most 10 redirects, with status 301, 302, 307 or 308, to
	// http or https, on the HTTP-01 port or 443, paths of at most 2,000 bytes, no
	// loop; a body of fewer than 128 bytes, compared after trailing white space is
	// cut.
	maxProbeRedirects = 10
	maxRedirectPath   = 2000
	maxProbeBody      = 128
	httpsPort         = 443
)

// preflight is the check an Issuer runs before each order with --preflight http.
type preflight struct {
	pool     *pgxpool.Pool
	log      *zap.Logger
	resolver *net.Resolver
	port     int
	// allow are the reserved ranges --preflight-allow-cidr lets it connect to.
	allow []netip.Prefix
	// dnsTimeout is dnsTimeout; a field for tests.
	dnsTimeout time.Duration
}

// newPreflight is the configured preflight, or nil when it is off.
func newPreflight(pool *pgxpool.Pool, log *zap.Logger, cfg Config) *preflight {
	if cfg.Preflight != PreflightHTTP {
		return nil
	}
	// Config.validate has parsed it already.
	allow, _ := ParseAllowCIDR(cfg.PreflightAllowCIDR)
	p := &preflight{
		pool: pool, log: log.Named("preflight"), resolver: net.DefaultResolver,
		port: cfg.PreflightPort, allow: allow, dnsTimeout: dnsTimeout,
	}
	if p.port == 0 {
		p.port = DefaultPreflightPort
	}
	if server := cfg.PreflightResolver; server != "" {
		d := &net.Dialer{}
		p.resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, server)
		}}
	}
	return p
}

// check runs the preflight for domain. It returns a *issuing.PreflightError saying
// what was seen when the CA's validation would fail; nil when it would pass, and
// also when the configured resolver did not answer (that is the worker's trouble,
// not the name's: the CA decides). Nothing is sent to the CA.
func (p *preflight) check(ctx context.Context, domain string) error {
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	run := &probeRun{p: p, domain: domain, addrs: map[string][]netip.Addr{}}
	err := p.run(ctx, run, domain)
	if errors.Is(err, errResolverSilent) {
		p.log.Warn("preflight skipped: the DNS resolver did not answer",
			issuing.LogDomainCtx(ctx, domain), zap.String("error", err.Error()))
		return nil
	}
	return err
}

// run resolves domain, then probes it with a token of its own.
func (p *preflight) run(ctx context.Context, run *probeRun, domain string) error {
	if _, err := run.resolve(ctx, domain); err != nil {
		return err
	}
	token, err := probeToken()
	if err != nil {
		return err
	}
	if err := p.store(ctx, domain, token); err != nil {
		return err
	}
	defer p.remove(ctx, token)
	return run.probe(ctx, domain, token)
}

// store saves the probe token like an HTTP-01 token (the key authorization served
// is the token itself), so that whichever instance's responder the name reaches
// answers it.
func (p *preflight) store(ctx context.Context, domain, token string) error {
	_, err := p.pool.Exec(ctx, `
INSERT INTO certworker_http01_tokens (token, key_authorization, domain, expires_at)
VALUES ($1, $1, $2, now() + $3 * interval '1 second')`,
		token, domain, int64(probeTTL/time.Second))
	if err != nil {
		return fmt.Errorf("acme: preflight: store probe token: %w", err)
	}
	return nil
}

// remove deletes the probe token, also after ctx ended.
func (p *preflight) remove(ctx context.Context, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenWriteTimeout)
	defer cancel()
	if _, err := p.pool.Exec(ctx, `DELETE FROM certworker_http01_tokens WHERE token = $1`, token); err != nil {
		p.log.Warn("could not delete the preflight probe token; it expires by itself",
			zap.Duration("expires_in", probeTTL), zap.Error(err))
	}
}

// probeToken is a random token shaped like an ACME one (RFC 8555 §8.3: base64url,
// at least 128 bits).
func probeToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("acme: preflight: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// errResolverSilent: the configured DNS resolver did not answer in time.
var errResolverSilent = errors.New("the DNS resolver did not answer")

// probeRun is one preflight's HTTP probe: the names it resolved, and the address
// it last connected to or tried, for its message.
type probeRun struct {
	p *preflight
	// domain is the name checked: the tenant's own. Any other host the probe meets
	// is a redirect's, whose addresses ssl_error never shows (redirectUnreachable).
	domain string

	mu    sync.Mutex // guards the fields below
	addrs map[string][]netip.Addr
	last  string
	// lastHost is the host whose address last is.
	lastHost string
}

// resolve looks host up with the preflight's resolver, once per run. A host with a
// reserved address among its answers is refused, whatever the others are: the CA
// might pick that one, and the preflight must not connect to it (reserved.go).
//
// The name is looked up fully qualified (a trailing dot in the query, never in the
// Host header), so the resolver's search list never applies: a tenant's redirect to
// "db" or "db.internal" must not find the operator's own names. A redirect's host
// that does not resolve, or resolves to a reserved address, or whose lookup fails, is
// refused in the same words (redirectUnreachable): what the operator's resolver says
// of a name the tenant does not own is the operator's, and different words would let
// a tenant tell its internal names from names that do not exist. The detail goes to
// the log.
func (r *probeRun) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	addrs, err := r.lookUp(ctx, host)
	var pe *issuing.PreflightError
	if host != r.domain && errors.As(err, &pe) {
		r.p.log.Info("preflight: a redirect's host has no public address", issuing.LogDomainCtx(ctx, r.domain),
			zap.String("redirect_host", host), zap.String("reason", pe.Msg))
		return nil, redirectUnreachable(r.domain, host)
	}
	return addrs, err
}

// redirectUnreachable is the preflight's one verdict on a redirect's host that the CA
// could not reach: unknown, reserved, or failing to resolve alike (resolve).
func redirectUnreachable(domain, host string) error {
	return &issuing.PreflightError{Msg: fmt.Sprintf("%s redirects to %s, which has no public address the CA could reach", domain, host)}
}

// lookUp is resolve's look-up, with what the tenant may be told of its own name.
func (r *probeRun) lookUp(ctx context.Context, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	cached, ok := r.addrs[host]
	r.mu.Unlock()
	if ok {
		return cached, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if isReserved(ip, r.p.allow) {
			return nil, &issuing.PreflightError{Msg: fmt.Sprintf("%s is a reserved address", ip.Unmap())}
		}
		return []netip.Addr{ip}, nil
	}
	lctx, cancel := context.WithTimeout(ctx, r.p.dnsTimeout)
	defer cancel()
	addrs, err := r.p.resolver.LookupNetIP(lctx, "ip", fullyQualified(host))
	var dnsErr *net.DNSError
	switch {
	case err != nil && ctx.Err() != nil:
		// The order was given up (or the preflight's time is over): no verdict.
		return nil, fmt.Errorf("acme: preflight: look up %s: %w", host, context.Cause(ctx))
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound, err == nil && len(addrs) == 0:
		return nil, &issuing.PreflightError{Msg: fmt.Sprintf("no such name: %s does not resolve to an address", host)}
	case errors.As(err, &dnsErr) && dnsErr.IsTimeout && ctx.Err() == nil:
		return nil, fmt.Errorf("%w: %s", errResolverSilent, dnsErr.Error())
	case errors.As(err, &dnsErr):
		return nil, &issuing.PreflightError{Msg: fmt.Sprintf("DNS lookup of %s failed: %s", host, dnsErr.Err)}
	case err != nil:
		return nil, fmt.Errorf("acme: preflight: look up %s: %w", host, err)
	}
	for _, a := range addrs {
		if isReserved(a, r.p.allow) {
			return nil, reservedAnswer(host, a)
		}
	}
	r.mu.Lock()
	r.addrs[host] = addrs
	r.mu.Unlock()
	return addrs, nil
}

// fullyQualified is host with a trailing dot, for a DNS query that no search list
// applies to.
func fullyQualified(host string) string {
	if strings.HasSuffix(host, ".") {
		return host
	}
	return host + "."
}

// dial connects to a host of the probe the way Boulder's VA does: the first IPv6
// address, then the first IPv4 address if that fails. Port 80 is the preflight's
// port (as the VA's configured HTTP port replaces 80).
func (r *probeRun) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if port == "80" {
		port = strconv.Itoa(r.p.port)
	}
	addrs, err := r.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if a.Unmap().Is4() {
			v4 = append(v4, a.Unmap())
		} else {
			v6 = append(v6, a)
		}
	}
	var tries []netip.Addr
	if len(v6) > 0 {
		tries = append(tries, v6[0])
	}
	if len(v4) > 0 {
		tries = append(tries, v4[0])
	}
	d := &net.Dialer{Control: r.p.control}
	for _, ip := range tries {
		target := net.JoinHostPort(ip.String(), port)
		r.mu.Lock()
		r.last, r.lastHost = target, host
		r.mu.Unlock()
		var conn net.Conn
		if conn, err = d.DialContext(ctx, network, target); err == nil {
			return conn, nil
		}
		var re *reservedDialError
		if errors.As(err, &re) {
			if host != r.domain {
				r.p.log.Info("preflight: a redirect's host has no public address", issuing.LogDomainCtx(ctx, r.domain),
					zap.String("redirect_host", host), zap.String("reason", re.Error()))
				return nil, redirectUnreachable(r.domain, host)
			}
			return nil, reservedAnswer(host, re.addr)
		}
	}
	return nil, err
}

// control is the probe's dialer's last look at the address it is about to connect
// to, the one the socket is given, after every resolution and redirect: a reserved
// one is refused before any packet leaves. resolve has refused such answers already;
// this catches what a change to the dialing path, or a name whose answers changed
// between the check and the dial, would let through.
func (p *preflight) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// The dialer always passes IP:port; anything else is not dialed.
		return fmt.Errorf("acme: preflight: refusing to dial %q: not an address", address)
	}
	if isReserved(ap.Addr(), p.allow) {
		return &reservedDialError{addr: ap.Addr().Unmap()}
	}
	return nil
}

// reservedDialError is control's refusal.
type reservedDialError struct{ addr netip.Addr }

func (e *reservedDialError) Error() string {
	return fmt.Sprintf("refusing to connect to the reserved address %s", e.addr)
}

// reservedAnswer is the preflight's verdict on a host with a reserved address.
func reservedAnswer(host string, addr netip.Addr) error {
	return &issuing.PreflightError{Msg: fmt.Sprintf("%s resolves to a reserved address (%s)", host, addr.Unmap().WithZone(""))}
}

// lastAddr is the address the probe last connected to, or tried, as ssl_error may
// show it: an address of the tenant's own name, or else the redirect's host it
// belongs to, never what the operator's resolver answered for that host.
func (r *probeRun) lastAddr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last != "" && r.lastHost != r.domain {
		return "the redirect's host " + r.lastHost
	}
	return r.last
}

// probe fetches the token from domain and compares.
func (r *probeRun) probe(ctx context.Context, domain, token string) error {
	target := "http://" + net.JoinHostPort(domain, strconv.Itoa(r.p.port)) + http01.ChallengePath(token)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("acme: preflight: %w", err)
	}
	req.Header.Set("User-Agent", userAgent+" preflight")
	req.Header.Set("Accept", "*/*")
	client := &http.Client{
		Transport: &http.Transport{
			DialContext:       r.dial,
			DisableKeepAlives: true,
			// The CA does not check the certificate of an https redirect's target
			// (it is the certificate being ordered that is missing), but refuses
			// TLS older than 1.2.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, //nolint:gosec
		},
		CheckRedirect: r.checkRedirect,
	}
	resp, err := client.Do(req)
	if err != nil {
		return r.unanswered(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		return r.unanswered(ctx, err)
	}
	where := r.lastAddr()
	if resp.Request != nil && resp.Request.URL.String() != target {
		where += " (after redirects, " + shownURL(resp.Request.URL) + ")"
	}
	// The status by its code alone: the reason phrase, like the body and the
	// headers, is whatever the server sent, and ssl_error is the tenant's to read.
	if resp.StatusCode != http.StatusOK {
		return &issuing.PreflightError{Msg: fmt.Sprintf("answered by something else at %s: HTTP %s", where, statusText(resp.StatusCode))}
	}
	if len(body) >= maxProbeBody || string(bytes.TrimRight(body, " \t\r\n")) != token {
		return &issuing.PreflightError{Msg: fmt.Sprintf("answered by something else at %s: HTTP %s with a body that is not the probe token", where, statusText(resp.StatusCode))}
	}
	return nil
}

// statusText is "404 Not Found": the code and Go's text for it, never the
// server's own reason phrase.
func statusText(code int) string {
	if text := http.StatusText(code); text != "" {
		return fmt.Sprintf("%d %s", code, text)
	}
	return strconv.Itoa(code)
}

// maxShownURL bounds a redirect's URL in a message: a Location header can be
// kilobytes long, and ssl_error is read in `certworker status` and by the tenant.
const maxShownURL = 200

// shownURL is a redirect's URL as a message shows it: scheme, host and path, without
// credentials, query or fragment, cut to maxShownURL bytes.
func shownURL(u *url.URL) string {
	s := (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
	if len(s) > maxShownURL {
		cut := maxShownURL
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}

// unanswered is the error of a probe that got no answer.
func (r *probeRun) unanswered(ctx context.Context, err error) error {
	var pe *issuing.PreflightError
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, errResolverSilent):
		return fmt.Errorf("acme: preflight: %w", err)
	case ctx.Err() != nil && context.Cause(ctx) != context.DeadlineExceeded:
		return fmt.Errorf("acme: preflight: %w", context.Cause(ctx))
	}
	addr := r.lastAddr()
	if addr == "" {
		addr = "its address"
	}
	return &issuing.PreflightError{Msg: fmt.Sprintf("no answer at %s: %s", addr, netReason(ctx, err))}
}

// netReason says in a few words why a connection gave no answer.
func netReason(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed without an answer"
	case ctx.Err() != nil, errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer within %s", preflightTimeout)
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		// The system's own words for an errno ("no route to host").
		return se.Err.Error()
	}
	// What is left quotes what the server sent (net/http's "malformed HTTP
	// response \"SSH-2.0-...\"", a TLS alert), which ssl_error must not: the
	// tenant reads it. Said in the preflight's own words instead.
	var rhe tls.RecordHeaderError
	switch {
	case errors.As(err, &rhe):
		return "not TLS at an https address"
	case strings.Contains(err.Error(), "tls:"):
		return "the TLS handshake failed"
	case strings.Contains(err.Error(), "malformed HTTP"), strings.Contains(err.Error(), "HTTP response to HTTPS client"):
		return "an answer that is not HTTP"
	}
	return "the connection failed without an HTTP answer"
}

// checkRedirect follows a redirect as the CA's validation does, or says why the
// CA would not.
func (r *probeRun) checkRedirect(req *http.Request, via []*http.Request) error {
	refuse := func(why string) error {
		return &issuing.PreflightError{Msg: fmt.Sprintf("redirected to %s, which the CA does not follow: %s", shownURL(req.URL), why)}
	}
	if len(via) > maxProbeRedirects {
		return refuse(fmt.Sprintf("more than %d redirects", maxProbeRedirects))
	}
	if code := req.Response.StatusCode; code != http.StatusMovedPermanently && code != http.StatusFound &&
		code != http.StatusTemporaryRedirect && code != http.StatusPermanentRedirect {
		return refuse(fmt.Sprintf("status %d (only 301, 302, 307 and 308 are followed)", code))
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return refuse("only http and https are followed")
	}
	if p := req.URL.Port(); p != "" && p != strconv.Itoa(r.p.port) && p != strconv.Itoa(httpsPort) {
		return refuse(fmt.Sprintf("only ports %d and %d are followed", r.p.port, httpsPort))
	}
	host := strings.ToLower(req.URL.Hostname())
	switch {
	case host == "":
		return refuse("no host")
	case strings.HasSuffix(host, ".well-known"):
		return refuse("the host looks like a path that lost its leading '/'")
	case len(req.URL.Path) > maxRedirectPath:
		return refuse(fmt.Sprintf("a path longer than %d bytes", maxRedirectPath))
	}
	// A redirect's host passes the rules of a domain's name (Boulder's VA refuses an
	// IP literal or a single label too): a single label would be looked up through
	// the resolver's search list, inside the operator's network.
	if _, err := issuing.CheckName(strings.TrimSuffix(host, ".")); err != nil {
		return refuse("not a public host name: " + err.Error())
	}
	for _, v := range via {
		if v.URL.String() == req.URL.String() {
			return refuse("a redirect loop")
		}
	}
	req.URL.Host = strings.ToLower(req.URL.Host)
	return nil
}
