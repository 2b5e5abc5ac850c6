// Package pebbletest runs Pebble, Let's Encrypt's test ACME server, inside the
// process: for the tests of package acme and of the worker, and for a demo program
// (it is an ordinary package, not a _test.go file, for that reason).
//
// What a CA is:
//   - Pebble's WFE (the ACME API) on a random loopback port, over TLS with a
//     throwaway root generated at Start (CA.RootsFile, CA.RootsPEM): pass RootsFile
//     to the worker as --acme-ca-bundle;
//   - Pebble's VA, which validates HTTP-01 challenges by connecting to
//     127.0.0.1:Options.HTTPPort whatever the name: every name resolves to
//     127.0.0.1 through a challtestsrv DNS server shared by the whole process;
//   - ACME Renewal Information (Pebble serves it always); two profiles, DefaultProfile
//     and AltProfile, and on request a short-lived one; a test whose order names no
//     profile fails (StartT), since Pebble gives such an order one at random;
//   - a record of the orders the CA received (CA.OrderRequests, CA.Orders), so that a
//     test can tell that a name never reached the CA, or that a renewal named the
//     certificate it replaces; a count of every request by step (CA.Requests), the
//     time the CA took to answer each (CA.Handled), and the state of each order's
//     authorizations (CA.AuthorizationStatus);
//   - control of what the CA says: names it refuses (CA.BlockName), a renewal window
//     it moves (CA.SetRenewalWindow), and, in front of it, a Front that answers
//     chosen requests with Let's Encrypt's real problems, 5xx or a dropped
//     connection, and rehearses a mass revocation (Front.StartDrill: the windows
//     of chosen or all certificates moved to now; Front.SetRenewalInfoRetryAfter:
//     a Retry-After of seconds instead of Pebble's 6 hours);
//   - control of its DNS (SetA, SetNoAddress, SetServFail, SetCNAME, and CAA records
//     with SetCAA), whose address (CA.DNSServer, DNSAddress) a preflight and a CAA
//     check can be pointed at.
//
// Several CAs run side by side in one process, each independent (its own ports,
// roots, accounts and orders), for tests of a worker with a fallback CA: give each
// its own CAAIdentity, advertised in its directory's meta.caaIdentities, and
// optionally RequireEAB with EABKeys. They share only the DNS. Pebble checks no CAA;
// a Front makes a CA refuse a name for its CAA records (CAAForbidden, at new-order
// or finalize):
//
//	first := pebbletest.StartT(t, pebbletest.Options{HTTPPort: port, CAAIdentity: "pebble-one.test"})
//	second := pebbletest.StartT(t, pebbletest.Options{HTTPPort: port, CAAIdentity: "pebble-two.test",
//		RequireEAB: true, EABKeys: map[string]string{"kid-1": hmacBase64URL}})
//	front := pebbletest.NewFront(t, first)
//	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name},
//		Answer: pebbletest.CAAForbidden(name)})
//	pebbletest.SetCAA(name, pebbletest.CAA{Tag: "issue", Value: "pebble-two.test"})
//
// Pebble's knobs that it reads from the environment (PEBBLE_VA_NOSLEEP,
// PEBBLE_WFE_NONCEREJECT, ...) are Options here: Start sets the variables, builds
// Pebble and restores them, under a lock, so CAs with different options can start in
// parallel tests.
//
// Pebble's VA has no way to be stopped: each CA leaves one idle goroutine behind
// after Close. Harmless in tests and demos, which is all this package is for.
package pebbletest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/core"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
)

const (
	// DefaultProfile is the name of Pebble's default profile.
	DefaultProfile = "default"
	// AltProfile is a second profile every CA offers, with the default profile's
	// lifetime: a CA offering one profile would hide an order that names none,
	// which Pebble gives a profile picked at random.
	AltProfile = "alternate"
	// ShortProfile is the profile Options.ShortLifetime adds.
	ShortProfile = "shortlived"

	// DirectoryPath and NewOrderPath are where Pebble serves the directory and
	// new-order (Pebble picks paths unlike Boulder's on purpose, to catch clients
	// that do not follow the directory).
	DirectoryPath = wfe.DirectoryPath
	NewOrderPath  = "/order-plz"
	// DefaultCAAIdentity is the CAA identity a CA advertises when
	// Options.CAAIdentity is "". A second CA in the same test should have its own.
	DefaultCAAIdentity = "pebbletest.invalid"
	// NewAccountPath is Pebble's new-account endpoint.
	NewAccountPath = "/sign-me-up"
	// challengePath is the prefix of Pebble's challenge URLs.
	challengePath = "/chalZ/"
	// certificatePath is where Pebble serves certificates, by serial in hex.
	certificatePath = "/certZ/"
)

// Options configure a CA. The zero value is a fast CA: no validation sleep, no
// nonce rejection, every order validated afresh, two profiles (DefaultProfile and
// AltProfile), and a test that fails when an order names no profile.
type Options struct {
	// HTTPPort is the port Pebble's VA connects to, on 127.0.0.1, to validate
	// HTTP-01 challenges: where the worker's responder listens. 0 picks a port free
	// at Start (CA.HTTPPort); a test that serves the responder itself should rather
	// listen on 127.0.0.1:0 first and pass that port, which cannot be taken in
	// between.
	HTTPPort int
	// ValidationSleep brings back Pebble's random sleep (0 to SleepSeconds) before
	// each validation; off is PEBBLE_VA_NOSLEEP=1.
	ValidationSleep bool
	// SleepSeconds is the longest validation sleep (PEBBLE_VA_SLEEPTIME); 0 is
	// Pebble's 5 seconds.
	SleepSeconds int
	// NonceReject is the percentage of good nonces rejected as bad
	// (PEBBLE_WFE_NONCEREJECT). Unlike Pebble, whose default is 5, 0 here is none.
	NonceReject int
	// AuthzReuse is the percentage of orders that reuse a valid authorization
	// instead of validating again (PEBBLE_AUTHZREUSE). Unlike Pebble, whose
	// default is 50, 0 here is never: every order goes through HTTP-01.
	AuthzReuse int
	// DefaultLifetime is the validity of the default profile's certificates; 0 is
	// Pebble's 90 days.
	DefaultLifetime time.Duration
	// ShortLifetime, when set, adds the profile ShortProfile whose certificates are
	// valid that long (a few minutes, for renewal tests). Pebble gives an order that
	// names no profile a random one, so an issuer should name one.
	ShortLifetime time.Duration
	// AllowUnnamedProfile lets orders name no profile. Without it StartT fails the
	// test when one did: Pebble picks a profile at random for such an order, so a
	// test whose orders name none passes or fails by chance (an order names the
	// domain's profile, or --acme-profile).
	AllowUnnamedProfile bool
	// ChallengeRetryAfter is a Retry-After (whole seconds, at least 1) added to
	// Pebble's answers to a challenge POST, which carry none, as a CA that says
	// when to look at the authorization again. 0 (or negative) adds none: the CA
	// says nothing, as Pebble itself, and the client looks at its own
	// pace.
	ChallengeRetryAfter time.Duration
	// RequireEAB makes new accounts need an external account binding; EABKeys
	// maps key ids to their base64url HMAC keys (EABKeys alone makes the keys
	// known to a CA that does not require them).
	RequireEAB bool
	EABKeys    map[string]string
	// CAAIdentity is the issuer domain name the directory advertises in
	// meta.caaIdentities (CA.CAAIdentity); "" is DefaultCAAIdentity. Pebble itself
	// checks no CAA: a test that wants the CA to refuse a name for its CAA records
	// says so with a Front rule (CAAForbidden), and a worker's own CAA check reads
	// records set with SetCAA.
	CAAIdentity string
	// Log receives Pebble's log; nil discards it.
	Log io.Writer
	// DNSServer, if set, is the DNS server (HOST:PORT, UDP and TCP) the VA asks in
	// place of the shared challtestsrv: a resolver of the test's own
	// (internal/dnsresolver) that forwards to it, for DNS-01 through a CNAME, which
	// the VA does not follow itself.
	DNSServer string
}

// Order is a new-order request the CA accepted.
type Order struct {
	Identifiers []string
	// Replaces is the RFC 9773 certificate id the order says it replaces, or "".
	Replaces string
	// Profile is the profile the order asked for, or "".
	Profile string
	// Authorizations are the URLs of the order's authorizations, as the CA
	// answered them (CA.AuthorizationStatus tells their state).
	Authorizations []string
	// URL is the order's own URL (the Location the CA answered), and Finalize its
	// finalize URL.
	URL, Finalize string
	// Finalized: the CA accepted a finalize request for the order (it issued, or
	// is issuing, its certificate).
	Finalized bool
}

// CA is a running Pebble.
type CA struct {
	// DirectoryURL is the ACME directory: https://127.0.0.1:PORT/dir.
	DirectoryURL string
	// HTTPPort is the port the VA validates HTTP-01 challenges against.
	HTTPPort int
	// RootsFile is a PEM file holding the root of the WFE's TLS certificate; it is
	// removed by Close.
	RootsFile string
	// DNSServer is the address (HOST:PORT, UDP and TCP) of the DNS server the VA
	// resolves names with, shared by every CA of the process: what a preflight's
	// resolver should be to see the names as the CA sees them.
	DNSServer string
	// CAAIdentity is the issuer domain name the directory advertises in
	// meta.caaIdentities (Options.CAAIdentity).
	CAAIdentity string

	minica        *minica
	pebbleCA      *ca.CAImpl
	store         *db.MemoryStore
	server        *http.Server
	dir           string
	retryAfter    string
	orderRequests atomic.Int64
	newAccounts   atomic.Int64
	// unnamedProfile counts new-order requests that named no profile.
	unnamedProfile atomic.Int64

	// newAccountMu serialises new-account requests (record).
	newAccountMu sync.Mutex
	mu           sync.Mutex // guards the fields below
	orders       []Order
	requests     map[Step]int
	finalized    map[string]bool // paths of accepted finalize requests
	// orderAnswers counts the order statuses answered to finalize requests and
	// order polls.
	orderAnswers map[string]int
	// servedSerials are the serials (hex) of the certificates the CA served.
	servedSerials []string
	// handled are the requests the CA answered, with their times.
	handled []Handled

	closeOnce sync.Once
}

// quietLog discards what net/http would log about clients the tests make
// misbehave (TLS errors, connections reset).
var quietLog = log.New(io.Discard, "", 0)

// envMu serialises Start's use of the process environment.
var envMu sync.Mutex

// Start starts a CA. Close stops it.
func Start(opts Options) (c *CA, err error) {
	// Pebble's constructors panic on the failures they do not expect (a key that
	// cannot be generated); a test gets an error instead.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("start pebble: %v", r)
		}
	}()

	dnsServer, err := sharedDNS()
	if err != nil {
		return nil, err
	}
	if opts.DNSServer != "" {
		dnsServer = opts.DNSServer
	}
	if opts.HTTPPort == 0 {
		if opts.HTTPPort, err = freeTCPPort(); err != nil {
			return nil, err
		}
	}
	mc, err := newMinica()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pebbletest-")
	if err != nil {
		return nil, err
	}
	if opts.CAAIdentity == "" {
		opts.CAAIdentity = DefaultCAAIdentity
	}
	c = &CA{
		HTTPPort: opts.HTTPPort, DNSServer: dnsServer, CAAIdentity: opts.CAAIdentity, minica: mc, dir: dir,
		RootsFile: filepath.Join(dir, "roots.pem"), requests: map[Step]int{}, finalized: map[string]bool{},
		orderAnswers: map[string]int{},
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(c.RootsFile, mc.rootPEM, 0o644); err != nil {
		return nil, err
	}
	if opts.ChallengeRetryAfter > 0 {
		c.retryAfter = strconv.Itoa(max(1, int(opts.ChallengeRetryAfter/time.Second)))
	}

	logOut := opts.Log
	if logOut == nil {
		logOut = io.Discard
	}
	logger := log.New(logOut, "pebble ", log.LstdFlags)

	profiles := map[string]ca.Profile{
		DefaultProfile: {Description: "The default profile", ValidityPeriod: seconds(opts.DefaultLifetime)},
		AltProfile:     {Description: "Another profile, as long-lived", ValidityPeriod: seconds(opts.DefaultLifetime)},
	}
	if opts.ShortLifetime > 0 {
		profiles[ShortProfile] = ca.Profile{
			Description:    "Short-lived certificates, for renewal tests",
			ValidityPeriod: seconds(opts.ShortLifetime),
		}
	}

	store := db.NewMemoryStore()
	c.store = store
	for kid, key := range opts.EABKeys {
		if err := store.AddExternalAccountKeyByID(kid, key); err != nil {
			return nil, fmt.Errorf("EAB key %q: %w", kid, err)
		}
	}

	env := map[string]string{
		"PEBBLE_VA_NOSLEEP":      "0",
		"PEBBLE_VA_SLEEPTIME":    "",
		"PEBBLE_VA_ALWAYS_VALID": "0",
		"PEBBLE_WFE_NONCEREJECT": strconv.Itoa(opts.NonceReject),
		"PEBBLE_AUTHZREUSE":      strconv.Itoa(opts.AuthzReuse),
	}
	if !opts.ValidationSleep {
		env["PEBBLE_VA_NOSLEEP"] = "1"
	}
	if opts.SleepSeconds > 0 {
		env["PEBBLE_VA_SLEEPTIME"] = strconv.Itoa(opts.SleepSeconds)
	}
	var handler http.Handler
	withEnv(env, func() {
		c.pebbleCA = ca.New(logger, store, "", "ecdsa", 0, 1, profiles)
		vaImpl := va.New(logger, opts.HTTPPort, 0, false, dnsServer, store)
		// The CAA identity the directory advertises; Pebble never checks it.
		wfeImpl := wfe.New(logger, store, vaImpl, c.pebbleCA, []string{opts.CAAIdentity},
			false, opts.RequireEAB, 0, 0)
		handler = wfeImpl.Handler()
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.server = &http.Server{
		Handler:           c.record(handler),
		ReadHeaderTimeout: 10 * time.Second,
		// A test that sends garbage, or a client that does not trust the root,
		// makes the server log TLS errors; they are the test's business.
		ErrorLog: quietLog,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{mc.leaf},
			MinVersion:   tls.VersionTLS12,
		},
	}
	go func() { _ = c.server.ServeTLS(ln, "", "") }()
	c.DirectoryURL = "https://" + ln.Addr().String() + DirectoryPath
	return c, nil
}

// StartT starts a CA for a test and closes it when the test ends.
func StartT(t testing.TB, opts Options) *CA {
	t.Helper()
	c, err := Start(opts)
	if err != nil {
		t.Fatalf("pebble: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		if n := c.unnamedProfile.Load(); n > 0 && !opts.AllowUnnamedProfile {
			t.Errorf("pebbletest: %d orders named no profile, and Pebble gave each a profile picked at random: name one (acme.Config.Profile, --acme-profile)", n)
		}
	})
	return c
}

// RootsPEM is the PEM of the root the WFE's TLS certificate chains to (the content
// of RootsFile).
func (c *CA) RootsPEM() []byte { return bytes.Clone(c.minica.rootPEM) }

// IssuerRootsPEM is the PEM of the root Pebble issues certificates under, for a test
// that verifies an issued chain.
func (c *CA) IssuerRootsPEM() []byte {
	var out []byte
	for i := range c.pebbleCA.GetNumberOfRootCerts() {
		if root := c.pebbleCA.GetRootCert(i); root != nil {
			out = append(out, root.PEM()...)
		}
	}
	return out
}

// TLSCertificate is a server certificate for 127.0.0.1, ::1 and localhost under the
// same root as the CA's own, for a test server that stands in for the CA (a proxy in
// front of it, a CA answering garbage) and that an issuer trusting RootsFile reaches.
func (c *CA) TLSCertificate() tls.Certificate { return c.minica.leaf }

// NewTLSServer starts an httptest server with TLSCertificate. The caller closes it.
func (c *CA) NewTLSServer(h http.Handler) *httptest.Server {
	s := httptest.NewUnstartedServer(h)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{c.minica.leaf}, MinVersion: tls.VersionTLS12}
	s.Config.ErrorLog = quietLog
	s.StartTLS()
	return s
}

// OrderRequests is how many new-order requests reached the CA, accepted or not
// (a request retried after a rejected nonce counts twice).
func (c *CA) OrderRequests() int { return int(c.orderRequests.Load()) }

// NewAccounts is how many accounts the CA created (an existing key registering again
// is not counted).
func (c *CA) NewAccounts() int { return int(c.newAccounts.Load()) }

// Orders are the orders the CA accepted, in the order it accepted them.
func (c *CA) Orders() []Order {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]Order(nil), c.orders...)
	for i := range out {
		out[i].Finalized = c.finalized[urlPath(out[i].Finalize)]
	}
	return out
}

// urlPath is the path of u, or "" when it does not parse: the CA's URLs name the
// host the client used (a Front's, or the CA's own), the path is the resource.
func urlPath(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return p.Path
}

// Close stops the CA's listener and removes RootsFile. It is safe to call twice.
func (c *CA) Close() error {
	var err error
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if c.server != nil {
			if err = c.server.Shutdown(ctx); err != nil {
				_ = c.server.Close()
			}
		}
		_ = os.RemoveAll(c.dir)
	})
	return err
}

// record wraps the WFE: it counts every request by step, records new orders and
// accounts, and adds Retry-After to challenge answers (Options.ChallengeRetryAfter).
func (c *CA) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := Handled{Step: StepOf(r), Start: time.Now()}
		c.mu.Lock()
		c.requests[h.Step]++
		c.mu.Unlock()
		defer func() {
			h.End = time.Now()
			c.mu.Lock()
			c.handled = append(c.handled, h)
			c.mu.Unlock()
		}()
		switch {
		case r.Method == http.MethodPost && r.URL.Path == NewOrderPath:
			c.recordOrder(next, w, r)
		case r.Method == http.MethodPost && r.URL.Path == NewAccountPath:
			// One at a time: Pebble's NewAccount stores the new account, then sets
			// its orders URL on the stored copy, while a concurrent request with the
			// same key (two instances registering one stored key) encodes it: a
			// data race in Pebble (v2.10.3, wfe.go), which the race detector reports
			// against whichever test is running.
			c.newAccountMu.Lock()
			defer c.newAccountMu.Unlock()
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			if sw.status == http.StatusCreated {
				c.newAccounts.Add(1)
			}
		case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/finalize-order/"):
			sw := &statusWriter{ResponseWriter: w, capture: true}
			next.ServeHTTP(sw, r)
			c.mu.Lock()
			if sw.status == http.StatusOK {
				c.finalized[r.URL.Path] = true
			}
			c.countOrderAnswer(sw)
			c.mu.Unlock()
		case r.Method == http.MethodPost && h.Step == StepOrder:
			sw := &statusWriter{ResponseWriter: w, capture: true}
			next.ServeHTTP(sw, r)
			c.mu.Lock()
			c.countOrderAnswer(sw)
			c.mu.Unlock()
		case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, certificatePath):
			serial, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, certificatePath), "/")
			c.settleIssued(serial)
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			if sw.status == http.StatusOK {
				c.served(serial)
			}
		default:
			if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, challengePath) && c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			next.ServeHTTP(w, r)
		}
	})
}

// recordOrder passes a new-order request on and records it when the CA accepted it,
// with the authorizations the CA answered.
func (c *CA) recordOrder(next http.Handler, w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read body", http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	c.orderRequests.Add(1)
	o, err := parseOrder(body)
	if err == nil && o.Profile == "" {
		c.unnamedProfile.Add(1)
	}
	if err == nil && o.Replaces != "" {
		c.syncReplaced(o.Replaces)
	}
	sw := &statusWriter{ResponseWriter: w, capture: true}
	next.ServeHTTP(sw, r)
	if sw.status != http.StatusCreated || err != nil {
		return
	}
	var answer struct {
		Authorizations []string `json:"authorizations"`
		Finalize       string   `json:"finalize"`
	}
	if json.Unmarshal(sw.body.Bytes(), &answer) == nil {
		o.Authorizations, o.Finalize = answer.Authorizations, answer.Finalize
	}
	o.URL = sw.Header().Get("Location")
	c.mu.Lock()
	c.orders = append(c.orders, o)
	c.mu.Unlock()
}

// Pebble (v2.10.3) finishes an order in a goroutine of its own: it issues the
// certificate, then files the order under the certificate's serial and, for a
// renewal, marks the order it replaces as replaced, writing IsReplaced under that
// order's lock; a new order naming the same certificate reads IsReplaced without
// the lock. So a client quick enough to download its certificate and order again
// could meet an order not yet marked (and no alreadyReplaced), and the race
// detector flags the read. settleIssued and syncReplaced close both, on the CA's
// side of the wire: the certificate is served only once Pebble's bookkeeping for it
// is done, and a new order takes the replaced order's lock before Pebble reads it.

// settleIssued waits, up to 5 seconds, until Pebble has filed the order that
// issued the certificate with serial (hex) and marked the order it replaces.
func (c *CA) settleIssued(serial string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if c.issueSettled(serial) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *CA) issueSettled(serial string) bool {
	o, err := c.store.GetOrderByIssuedSerial(serial)
	if err != nil {
		return false
	}
	o.RLock()
	replaces := o.Replaces
	o.RUnlock()
	if replaces == "" {
		return true
	}
	old := c.replacedOrder(replaces)
	if old == nil {
		// Pebble cannot mark it either.
		return true
	}
	old.RLock()
	defer old.RUnlock()
	return old.IsReplaced
}

// syncReplaced takes and drops the lock of the order that issued the certificate
// replaces names (an RFC 9773 certificate id), so that what Pebble wrote under it
// happens before this request reads it.
func (c *CA) syncReplaced(replaces string) {
	if old := c.replacedOrder(replaces); old != nil {
		old.RLock()
		_ = old.IsReplaced
		old.RUnlock()
	}
}

// replacedOrder is the order that issued the certificate with the id replaces, or
// nil when Pebble knows none.
func (c *CA) replacedOrder(replaces string) *core.Order {
	_, encoded, ok := strings.Cut(replaces, ".")
	if !ok {
		return nil
	}
	sn, err := base64.RawURLEncoding.DecodeString(encoded)
	if err != nil {
		return nil
	}
	o, err := c.store.GetOrderByIssuedSerial(hex.EncodeToString(new(big.Int).SetBytes(sn).Bytes()))
	if err != nil {
		return nil
	}
	return o
}

// served records that the CA served the certificate with serial (hex).
func (c *CA) served(serial string) {
	n, ok := new(big.Int).SetString(serial, 16)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.servedSerials = append(c.servedSerials, n.Text(16))
}

// IssuedSerials are the serial numbers (lower-case hex, no leading zeros) of the
// certificates the CA issued and served so far, in the order served (a certificate
// fetched twice is listed twice).
func (c *CA) IssuedSerials() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.servedSerials)
}

// Requests is how many requests of each step reached the CA so far (through any
// Front, or directly).
func (c *CA) Requests() map[Step]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.requests)
}

// OrderAnswers counts the order statuses ("processing", "valid", ...) the CA gave in
// its answers to finalize requests and to order polls so far: a client that polls an
// order only while the CA says it is not done polls once per answer that is not
// "valid" (or "invalid"). Pebble issues in the background after a finalize, so how
// many "processing" answers it gives depends on how fast the machine is.
func (c *CA) OrderAnswers() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.orderAnswers)
}

// countOrderAnswer counts the status of an order the CA answered into sw (a 200 with
// an order object). c.mu is held.
func (c *CA) countOrderAnswer(sw *statusWriter) {
	if sw.status != http.StatusOK {
		return
	}
	var o struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(sw.body.Bytes(), &o) == nil && o.Status != "" {
		c.orderAnswers[o.Status]++
	}
}

// Handled is a request the CA answered: its step, when it reached the CA's handler
// and when the handler returned (time.Now in this process: monotonic).
type Handled struct {
	Step       Step
	Start, End time.Time
}

// Handled are the requests the CA answered so far, in the order they ended: what a
// benchmark subtracts from an order's time to tell the CA's share from the client's.
func (c *CA) Handled() []Handled {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.handled)
}

// AuthorizationStatus is the state of the authorization at url ("pending",
// "valid", "invalid", "deactivated", ...), or "" when the CA does not know it.
func (c *CA) AuthorizationStatus(url string) string {
	authz := c.store.GetAuthorizationByID(path.Base(url))
	if authz == nil {
		return ""
	}
	authz.RLock()
	defer authz.RUnlock()
	return authz.Status
}

// BlockName makes the CA refuse to issue for name and every name under it, with
// the problem rejectedIdentifier, as a CA's policy does.
func (c *CA) BlockName(name string) error { return c.store.AddBlockedDomain(name) }

// SetRenewalWindow makes the CA suggest [start, end) as the renewal window of the
// certificate with this serial number, as a CA does when it means to revoke it.
func (c *CA) SetRenewalWindow(serial *big.Int, start, end time.Time) error {
	window, err := json.Marshal(map[string]any{
		"suggestedWindow": map[string]string{
			"start": start.UTC().Format(time.RFC3339),
			"end":   end.UTC().Format(time.RFC3339),
		},
	})
	if err != nil {
		return err
	}
	return c.store.SetARIResponse(serial, string(window))
}

// parseOrder reads a new-order JWS (flattened JSON serialisation) without checking
// its signature: Pebble does that.
func parseOrder(body []byte) (Order, error) {
	var jws struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal(body, &jws); err != nil {
		return Order{}, err
	}
	payload, err := base64.RawURLEncoding.DecodeString(jws.Payload)
	if err != nil {
		return Order{}, err
	}
	var req struct {
		Identifiers []struct {
			Value string `json:"value"`
		} `json:"identifiers"`
		Replaces string `json:"replaces"`
		Profile  string `json:"profile"`
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		return Order{}, err
	}
	if len(req.Identifiers) == 0 {
		return Order{}, errors.New("no identifiers")
	}
	o := Order{Replaces: req.Replaces, Profile: req.Profile}
	for _, id := range req.Identifiers {
		o.Identifiers = append(o.Identifiers, id.Value)
	}
	return o, nil
}

type statusWriter struct {
	http.ResponseWriter
	status int
	// capture keeps a copy of the body (a new order's answer is a few hundred
	// bytes).
	capture bool
	body    bytes.Buffer
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.capture {
		w.body.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

// withEnv runs f with the process environment changed as env says ("" unsets),
// then puts it back.
func withEnv(env map[string]string, f func()) {
	envMu.Lock()
	defer envMu.Unlock()
	type saved struct {
		value string
		set   bool
	}
	old := make(map[string]saved, len(env))
	for k, v := range env {
		prev, set := os.LookupEnv(k)
		old[k] = saved{prev, set}
		if v == "" {
			_ = os.Unsetenv(k)
		} else {
			_ = os.Setenv(k, v)
		}
	}
	defer func() {
		for k, s := range old {
			if s.set {
				_ = os.Setenv(k, s.value)
			} else {
				_ = os.Unsetenv(k)
			}
		}
	}()
	f()
}

// seconds is a lifetime in Pebble's unit; 0 leaves Pebble's default.
func seconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(max(1, d/time.Second))
}

// finalizeNames are the identifiers of the accepted order whose finalize URL has
// path p, or nil when the CA accepted none.
func (c *CA) finalizeNames(p string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.orders {
		if urlPath(o.Finalize) == p {
			return slices.Clone(o.Identifiers)
		}
	}
	return nil
}
