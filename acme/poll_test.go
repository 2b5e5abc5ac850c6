package acme_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue/issuing"
)

const ms = time.Millisecond

// When the CA says nothing of when to look (no Retry-After), an order looks at the
// authorization 25 ms and 100 ms after the CA answered the challenge, and at the
// order 10 ms and 50 ms after the finalize, then at the usual pace (1 s, then each
// wait half as long again; 500 ms for the order); an order that has already spent
// its two early looks finding the CA at work looks at the usual pace at once, and
// one that spent one has one left. Guards against a fixed second before the first
// look (what every tenant waited after "verify"), and against early looks beyond the
// two an order may waste at a slow CA.
func TestPoll_EarlyLooksThenTheUsualPace(t *testing.T) {
	t.Parallel()
	require.Equal(t, []time.Duration{25 * ms, 100 * ms, time.Second, 2500 * ms, 4750 * ms},
		acme.LookTimes(true, 0, 5), "authorization, nothing wasted yet")
	require.Equal(t, []time.Duration{10 * ms, 50 * ms, 500 * ms, 1250 * ms},
		acme.LookTimes(false, 0, 4), "order, nothing wasted yet")
	require.Equal(t, []time.Duration{10 * ms, 500 * ms, 1250 * ms},
		acme.LookTimes(false, 1, 3), "order, one early look wasted on the authorization")
	require.Equal(t, []time.Duration{500 * ms, 1250 * ms},
		acme.LookTimes(false, 2, 2), "order, both early looks wasted on the authorization")
}

// slowValidation makes the HTTP-01 port answer each request after d, as a CA that
// takes that long to validate.
func slowValidation(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			next.ServeHTTP(w, r)
		case <-r.Context().Done():
		}
	})
}

// At a CA that takes more than a second to validate and says nothing of when to
// look, an order with the early looks sends at most two requests more than an order
// at the usual pace alone (the waits before the early looks), counted at Pebble by
// step: the two early looks at the authorization, and no early look at the order
// after them. Guards against early looks that multiply a slow CA's requests (a
// doubling from 50 ms would send seven looks in the 1.2 s).
func TestIssue_ASlowCACostsAtMostTwoRequestsMore(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, false)
	r := acme.NewResponder(b.pool, zap.NewNop(), acme.ResponderOptions{})
	tokens := listener.New(b.pool, zap.NewNop(), listener.Options{})
	tokens.Listen(acme.TokenChannel, r)
	require.NoError(t, tokens.Start(context.Background()))
	t.Cleanup(tokens.Stop)
	b.serve(t, slowValidation(r, 1200*ms))
	iss := newIssuer(t, b.pool, nil, b.config())
	ctx := testCtx(t, time.Minute)
	order := func() map[pebbletest.Step]int {
		before := b.ca.Requests()
		_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("slow")})
		require.NoError(t, err)
		return diff(b.ca.Requests(), before)
	}
	_ = order() // registers the account
	early := order()
	acme.UsualPaceOnly(iss, true)
	usual := order()
	t.Logf("early looks: %d requests: %s; usual pace: %d requests: %s", total(early), format(early), total(usual), format(usual))
	require.LessOrEqual(t, total(early), total(usual)+2)
	require.Equal(t, usual[pebbletest.StepOrder], early[pebbletest.StepOrder], "no early look at the order after two wasted")
	require.Equal(t, usual[pebbletest.StepAuthorization]+2, early[pebbletest.StepAuthorization], "the two early looks at the authorization")
}
