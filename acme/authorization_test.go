package acme_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// After a failed order no authorization of it is left pending at the CA (a pending
// authorization counts against the CA's limits until it expires, days later): the
// issuer deactivates it, also when the order was cancelled half-way, which it
// learns of only when lego's next request fails. A failed validation leaves its
// authorization invalid, not pending, and not deactivated: also when the CA
// says so in its answer to the challenge, before the issuer polls. Checked in Pebble's own records. Guards
// against a worker piling up pending authorizations with every order it gives up.
func TestIssue_FailedOrderLeavesNoPendingAuthorization(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// rule breaks the order after its authorization was created, or is nil.
		rule    *pebbletest.Rule
		respond bool
		// cancelHeld cancels the order once the front holds its challenge request.
		cancelHeld bool
		want       string
	}{
		{name: "the CA failing on the challenge", respond: true,
			rule: &pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Unavailable(http.StatusServiceUnavailable)},
			want: "deactivated"},
		{name: "the order cancelled while the CA holds the challenge", respond: true,
			rule:       &pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Stall: 20 * time.Second}},
			cancelHeld: true, want: "deactivated"},
		{name: "a failed validation", respond: false, want: "invalid"},
		// The CA's answer to the challenge already says invalid: the issuer must
		// remember it, not deactivate an authorization that is over.
		{name: "a failed validation the CA reports when it answers the challenge", respond: false,
			rule: &pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Decided: true}},
			want: "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, pebbletest.Options{}, tc.respond)
			if !tc.respond {
				b.serve(t, http.NotFoundHandler())
			}
			front := pebbletest.NewFront(t, b.ca)
			if tc.rule != nil {
				front.Add(*tc.rule)
			}
			ctx := testCtx(t, 30*time.Second)
			if tc.cancelHeld {
				// Cancelled when the CA holds the challenge, however long the order
				// took to get there: a second after the start, a busy host had not
				// yet sent the new order.
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				go func() {
					for !slices.ContainsFunc(front.Seen(), func(s pebbletest.Seen) bool { return s.Step == pebbletest.StepChallenge }) {
						select {
						case <-ctx.Done():
							return
						case <-time.After(10 * time.Millisecond):
						}
					}
					cancel()
				}()
			}
			_, err := newIssuer(t, b.pool, nil, frontConfig(b, front)).Issue(ctx, issuing.Request{Domain: randomName("z")})
			require.Error(t, err)
			orders := b.ca.Orders()
			require.Len(t, orders, 1)
			require.Len(t, orders[0].Authorizations, 1)
			authz := orders[0].Authorizations[0]
			// A cancelled order is cleaned up after Issue returned.
			require.Eventually(t, func() bool { return b.ca.AuthorizationStatus(authz) == tc.want },
				10*time.Second, 50*time.Millisecond, "authorization %s is %q", authz, b.ca.AuthorizationStatus(authz))
		})
	}
}
