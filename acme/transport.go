package acme

import (
	"context"
	"io"
	"net/http"
	"sync"
)

// maxResponseBody caps what is read from the CA in one response. A certificate chain
// is a few kilobytes; a CA answering an endless body must not grow the worker's
// memory without bound (lego reads bodies whole).
const maxResponseBody = 4 << 20

// orderTransport is the HTTP transport of one order. lego's calls take no context, so
// every request is given the order's: cancelling the order aborts the request in
// flight and fails the next ones at once. It also remembers the last HTTP 429 the CA
// sent, with its Retry-After, so that a rate limit is recognised even when the body
// is not an ACME problem document.
type orderTransport struct {
	base http.RoundTripper
	ctx  context.Context

	mu         sync.Mutex // guards the fields below
	saw429     bool
	retryAfter string
}

func (t *orderTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req.WithContext(t.ctx))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		t.mu.Lock()
		t.saw429 = true
		t.retryAfter = resp.Header.Get("Retry-After")
		t.mu.Unlock()
	}
	resp.Body = limitedBody{Reader: io.LimitReader(resp.Body, maxResponseBody), Closer: resp.Body}
	return resp, nil
}

// last429 reports whether the CA answered 429 during the order, and its Retry-After.
func (t *orderTransport) last429() (bool, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.saw429, t.retryAfter
}

type limitedBody struct {
	io.Reader
	io.Closer
}
