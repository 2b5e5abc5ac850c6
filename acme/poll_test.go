package acme_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

const ms = time.Millisecond

// At a CA that holds an authorization's "valid" back for 300 ms and for 1.5 s after
// its answer to the challenge (and says nothing of when to look), the order sees it
// valid by a look due at most max(100 ms, a quarter of the time waited) after it
// was, and no gap between two looks is longer than the curve allows at that point;
// after the finalize, the first look at the order is due within 100 ms. The looks
// are held to when the issuer had them due (acme.RecordLooks), and the front's record
// says that each reached the CA and which one saw the verdict: how late a loaded
// machine sends a look is the machine's (logged), not the curve's. A look due by the
// time the last answer came goes at once. Guards against a cliff in the schedule:
// with looks at 25 and 100 ms then 1 s, an authorization valid at 300 ms is seen at
// 1 s, one valid at 1.5 s at 2.5 s; with 500 ms before the first look at the order,
// the finalize waits that long; and against looks the curve did not schedule (a
// poller of lego's own).
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
	// Every issuer of the package is recorded, those of the tests running beside this
	// one too: only the looks sent through this test's front are its own.
	scheduled := acme.RecordLooks(t)
	base := strings.TrimSuffix(front.DirectoryURL, pebbletest.DirectoryPath) + "/"
	for _, validation := range []time.Duration{300 * ms, 1500 * ms} {
		front.SetValidationTime(validation)
		// The curve is held to the CA's verdict only by an order whose look came
		// while the front still held that verdict back; on a busy machine the first
		// look can come after it (300 ms after the challenge's answer): such an order
		// proves nothing, and another is placed, up to three.
		var v pebbletest.Validation
		var before int
		for try := 1; ; try++ {
			before = len(scheduled())
			_, err := iss.Issue(ctx, issuing.Request{Domain: randomName("curve")})
			require.NoError(t, err)
			vs := front.Validations()
			v = vs[len(vs)-1]
			if try == 3 || slices.ContainsFunc(v.Looks, func(l pebbletest.Look) bool { return l.Held }) {
				break
			}
			t.Logf("validation %s: no look came before the CA's verdict was passed on (%d looks): another order", validation, len(v.Looks))
		}
		require.Equal(t, v.Answered.Add(validation), v.Ready)
		var authz, order []acme.ScheduledLook
		for _, l := range scheduled()[before:] {
			if !strings.HasPrefix(l.URL, base) {
				continue // another test's issuer, at another CA
			}
			if strings.HasSuffix(l.URL, v.Authorization) {
				authz = append(authz, l)
			} else {
				order = append(order, l)
			}
		}
		require.Len(t, authz, len(v.Looks), "validation %s: the looks the front saw and those the curve scheduled", validation)

		// The poll's clock starts when the issuer has the CA's answer to the challenge,
		// shift after the front passed it on. ready is the earliest, on that clock, the
		// CA can have been done: Ready, or a later look that the CA itself (not the
		// front) still answered "pending".
		shift := authz[0].Start.Sub(v.Answered)
		ready, seen := v.Ready.Add(shift), -1
		held := 0
		var late time.Duration
		for i, l := range v.Looks {
			due := authz[i].Due
			late = max(late, l.At.Sub(due))
			if i > 0 && authz[i].Waited {
				prev := authz[i-1].Due
				require.LessOrEqual(t, due.Sub(prev), max(acme.PollStep, prev.Sub(authz[i].Start)/acme.PollShare),
					"validation %s: the gap before the look due at %s", validation, due.Sub(authz[i].Start))
			}
			if l.Held {
				held++
			}
			if l.Status == "valid" {
				seen = i
				break
			}
			if !l.Held && due.After(ready) {
				ready = due
			}
		}
		require.NotEqual(t, -1, seen, "validation %s: never seen valid: %+v", validation, v.Looks)
		require.Positive(t, held, "validation %s: the front held the CA's verdict back at least once", validation)
		look := authz[seen]
		over, bound := look.Due.Sub(ready), max(acme.PollStep, ready.Sub(look.Start)/acme.PollShare)
		t.Logf("validation %s: %d looks, seen valid by a look due %s after it was (bound %s; waited for its time: %t), %d held back; the answer reached the issuer %s after the front passed it on, looks reached the CA up to %s after they were due",
			validation, len(v.Looks), over.Round(time.Millisecond), bound, look.Waited, held, shift.Round(time.Millisecond), late.Round(time.Millisecond))
		if look.Waited {
			require.LessOrEqual(t, over, bound, "validation %s", validation)
		}

		// The order's looks, when the CA was still issuing at the finalize's answer.
		if len(order) > 0 {
			require.LessOrEqual(t, order[0].Due.Sub(order[0].Start), acme.PollStep, "validation %s: the first look at the order", validation)
		}
	}
}
