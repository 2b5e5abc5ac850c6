package pebbletest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Front stands in front of a CA, at its own address: it passes every request on to
// the CA, except those a Rule answers itself. Give a client Front.DirectoryURL
// (with the CA's RootsFile as its trust) and the CA appears to rate-limit, refuse a
// name, fail or vanish on the steps and names the test chooses, with the texts
// Let's Encrypt really sends (problems.go), while everything else is Pebble.
//
// Rules are tried in the order they were added; the first that matches a request
// answers it. A rule with Times set is spent after that many answers. SetDown makes
// every request go unanswered (the connection is reset), as a CA that is down.
// Requests a rule answers never reach the CA, so CA.OrderRequests and CA.Requests
// count only what the CA itself saw; Front.Answered counts the others. Safe for
// concurrent use. For example, with the issuer's --acme-directory set to
// front.DirectoryURL:
//
//	front := pebbletest.NewFront(t, ca)
//	// Orders for a.shop.example and b.shop.example hit the registered domain's
//	// limit (every name under shop.example is paused, others are issued):
//	front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{"a.shop.example", "b.shop.example"},
//		Answer: pebbletest.RateLimitedRegisteredDomain("a.shop.example", time.Hour)})
//	// The next finalize of any order gets a 503 page (not charged: the CA's trouble):
//	front.Add(pebbletest.Rule{Step: pebbletest.StepFinalize, Times: 1, Answer: pebbletest.Unavailable(503)})
//	// The CA goes down for a while, then comes back:
//	front.SetDown(true)
//	front.SetDown(false)
//
// A rule can also hold the CA's answer (Answer.Hold), as a CA that takes its time:
// the request reaches the CA, and its answer reaches the client only when the test
// says so. Every request the front receives is logged (Front.Seen), so that a test
// tells what one client sent, and when.
//
// The answers with Let's Encrypt's texts are in problems.go: RateLimitedOrdersPerAccount
// (reach: the CA), RateLimitedRegisteredDomain (the registered domain),
// RateLimitedExactSet and RateLimitedFailedAuthorizations (the domain), Paused and
// RejectedIdentifier (permanent), ServerInternal and Unavailable (5xx), Dropped and
// TimedOut (unreachable). Answer{Decided: true} on StepChallenge answers with the
// CA's own verdict, as a CA that validates before it answers.
type Front struct {
	// DirectoryURL is the CA's directory through the front.
	DirectoryURL string

	srv   *httptest.Server
	proxy *httputil.ReverseProxy
	ca    *CA
	// oneAtATime, when set, lets one request at a time reach the CA (SetOneAtATime);
	// it holds passing's one place while it does.
	oneAtATime atomic.Bool
	passing    chan struct{}

	mu       sync.Mutex // guards the fields below
	rules    []*Rule
	down     bool
	answered map[Step]int
	seen     []Seen
	holding  int
	// drill and ariRetryAfter are the renewal information the front answers
	// itself or rewrites (drill.go).
	drill         *drillState
	ariRetryAfter time.Duration
	// validationTime and validations are the validation the front makes the CA
	// appear to take, and the challenges answered (front_validation.go).
	validationTime time.Duration
	validations    []*Validation
	// boulderReplaces: new orders are refused as Boulder does (front_replaces.go).
	boulderReplaces bool
}

// Seen is a request the front received.
type Seen struct {
	// At is when it arrived (time.Now in this process: monotonic).
	At   time.Time
	Step Step
	// Path is the request's path: which order, authorization or challenge.
	Path string
}

// Rule says which requests a Front answers itself, and how.
type Rule struct {
	// Step is the kind of request the rule answers; "" is every step.
	Step Step
	// Names limits a rule to new orders and finalizes for one of these names (an
	// order matches when any of its identifiers is listed); nil matches every
	// request of Step. A finalize's names are those of the order the CA accepted
	// with that finalize URL (CA.Orders). Other requests name no identifier, so a
	// rule with Names answers new orders and finalizes only.
	Names []string
	// Times is how many requests the rule answers before it is spent; 0 is every
	// one.
	Times int
	// Answer is what the front does instead of the CA.
	Answer Answer

	used int
}

// Answer is what a Front does with a request in place of the CA: send a problem
// document, send another body with a status, reset the connection, or hold the
// request without an answer.
type Answer struct {
	// Status is the HTTP status of the answer.
	Status int
	// Problem, when set, is sent as an ACME problem document
	// (application/problem+json), with Status.
	Problem *Problem
	// Body and ContentType are sent when Problem is nil (a load balancer's HTML
	// page, say).
	Body        string
	ContentType string
	// RetryAfter, when positive, is sent as Retry-After in seconds.
	RetryAfter time.Duration
	// Drop resets the connection without an answer: the CA cannot be reached.
	Drop bool
	// Stall holds the request that long, or until the client gives up, then
	// resets the connection: a request that times out.
	Stall time.Duration
	// Hold passes the request on to the CA and holds the CA's answer until Hold is
	// closed; a client that gives up meanwhile gets nothing (Front.Holding counts
	// the answers held now).
	Hold <-chan struct{}
	// Decided, for a challenge, passes the request on to the CA and answers only
	// once the CA has decided the challenge, with the challenge as it then stands
	// (status "valid" or "invalid", and its error): a CA whose validation ended
	// before it answered, which RFC 8555 allows and a fast CA does. Requests of
	// other steps pass on to the CA as usual.
	Decided bool
}

// Problem is an ACME problem document (RFC 8555 §6.7).
type Problem struct {
	Type   string `json:"type"`
	Detail string `json:"detail"`
	Status int    `json:"status,omitempty"`
}

// NewFront starts a Front before ca. It is closed when the test ends.
func NewFront(t testing.TB, ca *CA) *Front {
	t.Helper()
	target, err := url.Parse(ca.DirectoryURL)
	if err != nil {
		t.Fatalf("pebbletest front: %v", err)
	}
	target.Path = ""
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.RootsPEM())
	f := &Front{answered: map[Step]int{}, ca: ca, passing: make(chan struct{}, 1)}
	// Pebble builds its URLs from the Host header, which the proxy keeps, so every
	// URL the client follows comes back through the front.
	f.proxy = httputil.NewSingleHostReverseProxy(target)
	f.proxy.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	f.proxy.ErrorLog = quietLog
	f.proxy.ModifyResponse = chainModify(f.rewriteRetryAfter, f.holdValidation)
	f.srv = ca.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	f.DirectoryURL = f.srv.URL + DirectoryPath
	return f
}

// SetOneAtATime lets one request at a time reach the CA, the others waiting their
// turn at the front. Pebble (v2.10.3) takes its locks in opposite orders on
// different paths, and concurrent requests can stop it for good: GetOrderByID holds
// the store's read lock while it reads the order's status (the order's read lock,
// then each authorization's) and then takes the order's write lock, while a request
// for an authorization holds the authorization's write lock and then waits for its
// order's read lock. Two reads of an order and a request for one of its
// authorizations at once can each wait for another, and once one of them holds the
// store's read lock, the first write to the store (a new order) waits, and with it
// every request after it. A test that sends the CA hundreds of orders at once beside
// other work, where such a meeting is likely, turns this on; Pebble's own goroutines
// (validation, issuance) still run beside the one request.
func (f *Front) SetOneAtATime(on bool) { f.oneAtATime.Store(on) }

// pass hands r to the CA (SetOneAtATime).
func (f *Front) pass(w http.ResponseWriter, r *http.Request) {
	if f.oneAtATime.Load() {
		select {
		case f.passing <- struct{}{}:
			defer func() { <-f.passing }()
		case <-r.Context().Done():
			return // the client gave up while it waited: nothing reached the CA
		}
	}
	f.proxy.ServeHTTP(w, r)
}

// Add adds a rule.
func (f *Front) Add(r Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &r)
}

// Clear removes every rule and brings the CA back up.
func (f *Front) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules, f.down = nil, false
}

// SetDown makes every request go unanswered (down) or passes them on again.
func (f *Front) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// Seen is every request the front received, in the order they arrived.
func (f *Front) Seen() []Seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// Holding is how many answers Answer.Hold holds back now.
func (f *Front) Holding() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holding
}

// Answered is how many requests of each step the front answered itself.
func (f *Front) Answered() map[Step]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[Step]int, len(f.answered))
	for k, v := range f.answered {
		out[k] = v
	}
	return out
}

func (f *Front) serve(w http.ResponseWriter, r *http.Request) {
	step, at := StepOf(r), time.Now()
	r = withArrival(r, at)
	f.mu.Lock()
	f.seen = append(f.seen, Seen{At: at, Step: step, Path: r.URL.Path})
	f.mu.Unlock()
	var names []string
	if step == StepNewOrder {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			drop(w)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if o, err := parseOrder(body); err == nil {
			names = o.Identifiers
			if f.alreadyReplaced(w, r, o.Replaces) {
				return
			}
		}
	}
	if step == StepFinalize {
		names = f.ca.finalizeNames(r.URL.Path)
	}
	answer, ok := f.match(step, names)
	switch {
	case !ok && step == StepRenewalInfo && f.answerRenewalInfo(w, r):
	case !ok:
		f.pass(w, r)
	case answer.Decided && step == StepChallenge:
		f.answerDecided(w, r)
	case answer.Decided:
		// Only a challenge has a verdict to wait for.
		f.pass(w, r)
	case answer.Hold != nil:
		f.answerHeld(w, r, answer.Hold)
	default:
		answer.write(w, r)
	}
}

// answerDecided passes a challenge request on to the CA, waits until the CA has
// decided the challenge, and answers with the CA's own answer (its headers and
// nonce included) with the challenge's status, error and validation time as they
// then stand.
func (f *Front) answerDecided(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	f.pass(rec, r)
	var body map[string]any
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &body) != nil {
		copyAnswer(w, rec, rec.Body.Bytes())
		return
	}
	chlg := f.ca.store.GetChallengeByID(path.Base(r.URL.Path))
	for chlg != nil {
		chlg.RLock()
		status, problem, validated := chlg.Status, chlg.Error, chlg.Validated
		chlg.RUnlock()
		if status != "pending" && status != "processing" {
			body["status"] = status
			if problem != nil {
				body["error"] = problem
			}
			if validated != "" {
				body["validated"] = validated
			}
			break
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	out, _ := json.Marshal(body)
	copyAnswer(w, rec, out)
}

// answerHeld passes a request on to the CA and writes the CA's answer once hold is
// closed, unless the client has gone away by then.
func (f *Front) answerHeld(w http.ResponseWriter, r *http.Request, hold <-chan struct{}) {
	rec := httptest.NewRecorder()
	f.pass(rec, r)
	f.mu.Lock()
	f.holding++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.holding--
		f.mu.Unlock()
	}()
	select {
	case <-hold:
		copyAnswer(w, rec, rec.Body.Bytes())
	case <-r.Context().Done():
	}
}

// copyAnswer writes the recorded answer rec with body in place of its own.
func copyAnswer(w http.ResponseWriter, rec *httptest.ResponseRecorder, body []byte) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

// match finds the answer for a request of step for names, and counts it.
func (f *Front) match(step Step, names []string) (Answer, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		f.answered[step]++
		return Answer{Drop: true}, true
	}
	for _, r := range f.rules {
		if r.Times > 0 && r.used >= r.Times {
			continue
		}
		if r.Step != "" && r.Step != step {
			continue
		}
		if r.Names != nil && !slices.ContainsFunc(names, func(n string) bool { return slices.Contains(r.Names, n) }) {
			continue
		}
		r.used++
		f.answered[step]++
		return r.Answer, true
	}
	return Answer{}, false
}

func (a Answer) write(w http.ResponseWriter, r *http.Request) {
	if a.Stall > 0 {
		// Until the body is read, net/http does not notice the client going
		// away.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(a.Stall):
		}
		drop(w)
		return
	}
	if a.Drop {
		drop(w)
		return
	}
	if a.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(a.RetryAfter.Round(time.Second)/time.Second)))
	}
	body, contentType := []byte(a.Body), a.ContentType
	if a.Problem != nil {
		p := *a.Problem
		if p.Status == 0 {
			p.Status = a.Status
		}
		body, _ = json.Marshal(p)
		contentType = "application/problem+json"
	}
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	// No Replay-Nonce: the front has none the CA would accept, and a client
	// without one asks the CA for a fresh nonce.
	w.WriteHeader(a.Status)
	_, _ = w.Write(body)
}

// drop resets the request's connection without an answer.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*tls.Conn); ok {
		if tcp, ok := tc.NetConn().(*net.TCPConn); ok {
			// A reset, not an orderly close: what a client sees from a CA whose
			// load balancer has no backend.
			_ = tcp.SetLinger(0)
		}
	}
	_ = conn.Close()
}
