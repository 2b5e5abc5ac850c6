package acme

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// countingTransport counts the requests that reach it, and answers none.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.n.Add(1)
	return nil, http.ErrServerClosed
}

// Past the claim's lease deadline an order sends nothing, not even a request the
// session could answer from its cache (the directory, a pooled nonce): lego would go
// on to sign with the nonce and post what follows. deadline.Bound cuts off the
// requests that go out, but not an answer served from the cache, so without the
// transport's own check the cached directory and nonce came back after the deadline.
func TestOrderTransport_AfterTheDeadlineNothingIsAnsweredFromTheCache(t *testing.T) {
	t.Parallel()
	const dirURL = "https://ca.test/directory"
	s := newSession(dirURL)
	now := time.Now()
	s.keepDirectory([]byte(`{"newNonce": "https://ca.test/nonce", "newOrder": "https://ca.test/order"}`), now)
	s.pushNonce("cached-nonce", now)
	base := &countingTransport{}
	deadline := issuing.NewDeadline(now, time.Minute)
	tr := &orderTransport{base: base, ctx: context.Background(), session: s, deadline: deadline}

	// Before the deadline, both come from the cache.
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, dirURL, nil))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Zero(t, base.n.Load(), "the cached directory was not used: the test does not test what it says")

	passed := issuing.NewDeadline(now.Add(-time.Hour), time.Minute)
	tr.deadline = passed
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodGet, dirURL, nil),
		httptest.NewRequest(http.MethodHead, "https://ca.test/nonce", nil),
	} {
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			_ = resp.Body.Close()
		}
		require.ErrorIs(t, err, issuing.ErrLeaseDeadline, "%s %s answered after the deadline", req.Method, req.URL)
	}
	require.Zero(t, base.n.Load(), "a request went out after the deadline")
	nonce, ok := s.popNonce(time.Now())
	require.True(t, ok, "the pooled nonce was spent after the deadline")
	require.Equal(t, "cached-nonce", nonce)
}
