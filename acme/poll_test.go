package acme_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

const ms = time.Millisecond

// lookSlack is what a look may take beyond its schedule to reach the front: the
// timer's wake-up, the request's signing and its way over loopback on a loaded
// machine. Far below the second a schedule with a cliff leaves.
const lookSlack = 50 * ms

// At a CA that holds an authorization's "valid" back for 300 ms and for 1.5 s after
// its answer to the challenge (and says nothing of when to look), the order sees it
// valid at most max(100 ms, a quarter of the time waited) after it was, and no gap
// between two looks is longer than the curve allows at that point; after the
// finalize, the order is looked at within 100 ms. Every time is the front's own
// record of the requests. Guards against a cliff in the schedule: with looks at 25
// and 100 ms then 1 s, an authorization valid at 300 ms is seen at 1 s, one valid at
// 1.5 s at 2.5 s; with 500 ms before the first look at the order, the finalize waits
// that long.
func TestIssue_SeesTheCAsVerdictWithinTheCurvesBound(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	cfg := b.config()
	cfg.DirectoryURL = front.DirectoryURL
	iss := newIssuer(t, b.pool, nil, cfg)
	ctx := testCtx(t, time.Minute)
	_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("curve")}) // registers the account
	require.NoError(t, err)
	for _, validation := range []time.Duration{300 * ms, 1500 * ms} {
		front.SetValidationTime(validation)
		seenBefore := len(front.Seen())
		_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("curve")})
		require.NoError(t, err)
		vs := front.Validations()
		v := vs[len(vs)-1]
		require.Equal(t, v.Answered.Add(validation), v.Ready)

		// ready is the earliest the CA can have been done: Ready, or a later look
		// that the CA itself still answered "pending".
		ready, seen := v.Ready, time.Time{}
		held := 0
		for i, l := range v.Looks {
			if i > 0 {
				prev := v.Looks[i-1].At
				require.LessOrEqual(t, l.At.Sub(prev), max(acme.PollStep, prev.Sub(v.Answered)/acme.PollShare)+lookSlack,
					"validation %s: the gap before the look at %s", validation, l.At.Sub(v.Answered))
			}
			if l.Held {
				held++
			}
			if l.Status == "valid" {
				seen = l.At
				break
			}
			if l.At.After(ready) {
				ready = l.At
			}
		}
		require.False(t, seen.IsZero(), "validation %s: never seen valid: %+v", validation, v.Looks)
		require.Positive(t, held, "validation %s: the front held the CA's verdict back at least once", validation)
		over, bound := seen.Sub(ready), max(acme.PollStep, ready.Sub(v.Answered)/acme.PollShare)
		t.Logf("validation %s: %d looks, seen valid %s after it was (bound %s), %d held back",
			validation, len(v.Looks), over.Round(time.Millisecond), bound, held)
		require.LessOrEqual(t, over, bound+lookSlack, "validation %s", validation)

		var finalized time.Time
		for _, s := range front.Seen()[seenBefore:] {
			switch {
			case s.Step == pebbletest.StepFinalize:
				finalized = s.At
			case s.Step == pebbletest.StepOrder && !finalized.IsZero():
				require.LessOrEqual(t, s.At.Sub(finalized), acme.PollStep+lookSlack, "validation %s: the first look at the order", validation)
				finalized = time.Time{}
			}
		}
	}
}
