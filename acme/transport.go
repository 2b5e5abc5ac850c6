package acme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/certworker/certworker/queue/issuing"
)

// maxResponseBody caps what is read from the CA in one response. A certificate chain
// is a few kilobytes; a CA answering an endless body must not grow the worker's
// memory without bound (lego reads bodies whole).
const maxResponseBody = 4 << 20

// orderTransport is the HTTP transport of one order (or one renewal-information
// query). lego's calls take no context, so every request is given the order's:
// cancelling the order aborts the request in flight and fails the next ones at
// once; the request's own deadline (http.Client.Timeout) still applies.
//
// It answers the directory and new-nonce requests from the Issuer's session when
// it can, and hands every nonce the CA sends to the session instead of to lego, so
// that a nonce serves whichever order signs next (lego's own pool then stays
// empty, and asks here for each request).
//
// An order's transport also enforces the claim's lease deadline (issuing.Issuer): no
// request goes out once it has passed, not even one the session could answer, and
// each request that goes out ends at the deadline at the latest.
//
// It also remembers what the order's failure needs to be classified: the last HTTP
// 429 and its Retry-After (a rate limit whose body is not a problem document), and
// the first sign that the CA could not be reached (no connection, a reset, a
// request that timed out) or answered 5xx.
type orderTransport struct {
	base    http.RoundTripper
	ctx     context.Context
	session *session
	// deadline is the claim's lease deadline, or nil (renewal information, tests).
	deadline *issuing.Deadline

	mu          sync.Mutex // guards the fields below
	saw429      bool
	retryAfter  string // of the last 429
	lastRetry   string // Retry-After of the last answer, whatever its status
	unavailable error
	newOrders   int
	// secondOrder: a second new-order request was refused (errSecondNewOrder).
	secondOrder bool
}

// errSecondNewOrder refuses a second new-order request within one order. An order
// is one new-order request: lego's own answer to alreadyReplaced posts the order
// again without "replaces", inside one call, and that order would count against
// every limit the renewal is exempt from, unseen by the ledger.
var errSecondNewOrder = errors.New("acme: a second new-order request within one order is not sent")

func (t *orderTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.deadline.Check(); err != nil {
		return nil, fmt.Errorf("%s %s not sent: %w", req.Method, req.URL.Redacted(), err)
	}
	now := time.Now()
	if resp, ok := t.fromSession(req, now); ok {
		return resp, nil
	}
	newNonce := t.session.isNewNonce(req)
	newOrder := t.session.isNewOrder(req)
	if newOrder {
		t.mu.Lock()
		second := t.newOrders > 0
		if second {
			t.secondOrder = true
		} else {
			t.newOrders++
		}
		t.mu.Unlock()
		if second {
			return nil, errSecondNewOrder
		}
	}

	// The request's context carries http.Client.Timeout; the order's, its
	// cancellation; the lease deadline caps both. Any of them ends the request, and
	// its body.
	bounded, unbound := t.deadline.Bound(t.ctx)
	ctx, cancel := context.WithCancelCause(bounded)
	stop := context.AfterFunc(req.Context(), func() { cancel(context.Cause(req.Context())) })
	release := func() { stop(); cancel(nil); unbound() }
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		release()
		t.noteUnreachable(req, err)
		return nil, err
	}
	if resp.StatusCode >= http.StatusInternalServerError {
		t.noteUnavailable(fmt.Errorf("the CA answered %s to %s %s", resp.Status, req.Method, req.URL.Redacted()))
	}
	t.mu.Lock()
	t.lastRetry = resp.Header.Get("Retry-After")
	if resp.StatusCode == http.StatusTooManyRequests {
		t.saw429, t.retryAfter = true, t.lastRetry
	}
	t.mu.Unlock()
	if nonce := resp.Header.Get("Replay-Nonce"); nonce != "" && !newNonce && t.session.sameOrigin(req.URL) {
		t.session.pushNonce(nonce, now)
		resp.Header.Del("Replay-Nonce")
	}
	body := &orderBody{Reader: io.LimitReader(resp.Body, maxResponseBody), body: resp.Body, release: release, t: t, req: req}
	resp.Body = body
	if req.Method == http.MethodHead {
		// No body to read, and lego does not close it.
		_ = body.Close()
	}
	if newOrder && resp.StatusCode == http.StatusBadRequest {
		// A new order refused for its nonce was not an order: lego sends it again
		// with a fresh nonce, and that one is let through.
		raw, err := io.ReadAll(body)
		_ = body.Close()
		if err != nil {
			return nil, err
		}
		if bytes.Contains(raw, []byte(problemBadNonce)) {
			t.mu.Lock()
			t.newOrders--
			t.mu.Unlock()
		}
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		return resp, nil
	}
	if t.session.isDirectory(req) && resp.StatusCode == http.StatusOK {
		raw, err := io.ReadAll(body)
		_ = body.Close()
		if err != nil {
			return nil, err
		}
		t.session.keepDirectory(raw, now)
		resp.Body = io.NopCloser(bytes.NewReader(raw))
	}
	return resp, nil
}

// fromSession answers a directory or new-nonce request from the session, when it
// has what is asked for.
func (t *orderTransport) fromSession(req *http.Request, now time.Time) (*http.Response, bool) {
	if t.session.isDirectory(req) {
		if body, ok := t.session.cachedDirectory(now); ok {
			return localResponse(req, body, nil), true
		}
	}
	if t.session.isNewNonce(req) {
		if nonce, ok := t.session.popNonce(now); ok {
			return localResponse(req, nil, http.Header{"Replay-Nonce": {nonce}}), true
		}
	}
	return nil, false
}

// localResponse is an answer the transport gives without asking the CA.
func localResponse(req *http.Request, body []byte, header http.Header) *http.Response {
	if header == nil {
		header = http.Header{}
	}
	if body != nil {
		header.Set("Content-Type", "application/json")
	}
	header.Set("Cache-Control", "no-store")
	return &http.Response{
		Status:        "200 OK",
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}
}

// noteUnreachable records a request that got no answer, unless the order was
// cancelled or its lease deadline cut the request off (then the order says so, not
// the CA). A request whose own deadline
// (http.Client.Timeout) has passed got no answer in time, whichever error net/http
// returns for it: http.Client ends such a request both by its context's deadline
// and by closing Request.Cancel on a timer of its own, so the transport may
// return context.DeadlineExceeded or "net/http: request canceled", and the
// context may not even say it is done yet.
func (t *orderTransport) noteUnreachable(req *http.Request, err error) {
	if t.ctx.Err() != nil || t.deadline.Check() != nil {
		return
	}
	deadline, hasDeadline := req.Context().Deadline()
	if errors.Is(err, context.DeadlineExceeded) || hasDeadline && !time.Now().Before(deadline) {
		err = fmt.Errorf("no answer in time (%w)", err)
	}
	t.noteUnavailable(fmt.Errorf("%s %s: %w", req.Method, req.URL.Redacted(), err))
}

func (t *orderTransport) noteUnavailable(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.unavailable == nil {
		t.unavailable = err
	}
}

// last429 reports whether the CA answered 429 during the order, and its Retry-After.
func (t *orderTransport) last429() (bool, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.saw429, t.retryAfter
}

// lastRetryAfter is the Retry-After of the CA's last answer (an order or an
// authorization still being processed), or 0.
func (t *orderTransport) lastRetryAfter() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return parseRetryAfter(t.lastRetry)
}

// unreachable is the first sign that the CA could not be reached or answered 5xx
// during the order, or nil.
func (t *orderTransport) unreachable() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unavailable
}

// refusedSecondOrder reports whether a second new-order request was refused.
func (t *orderTransport) refusedSecondOrder() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.secondOrder
}

// orderBody is a response body read through the order's context: a reset while it
// is read counts as the CA unreachable, and closing it releases the request's
// context.
type orderBody struct {
	io.Reader
	body    io.Closer
	release func()
	t       *orderTransport
	req     *http.Request
	once    sync.Once
}

func (b *orderBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		// lego does not close every body it reads to the end; the request's
		// context is released here instead.
		b.once.Do(b.release)
	case err != nil:
		b.t.noteUnreachable(b.req, err)
	}
	return n, err
}

func (b *orderBody) Close() error {
	err := b.body.Close()
	b.once.Do(b.release)
	return err
}
