package issuing_test

import (
	"testing"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/stretchr/testify/require"
)

// The two CAs of the decision's tests.
const (
	testDirectory   = "https://ca.invalid/directory"
	secondDirectory = "https://second.invalid/directory"
)

// Decide: the claim's choice stands unless CAA forbids it, or the first CA has just
// refused the name; a CA that CAA forbids or that refused the name is never asked;
// the domain fails only when both may not be.
func TestDecide(t *testing.T) {
	t.Parallel()
	fb := &issuing.Fallback{Directory: secondDirectory}
	only := func(dirs ...string) issuing.Verdict {
		return func(d string) bool {
			for _, x := range dirs {
				if x == d {
					return true
				}
			}
			return false
		}
	}
	atFirst := issuing.Claim{Directory: testDirectory}
	atSecond := issuing.Claim{Directory: secondDirectory, FallbackCause: issuing.FallbackOutage}
	refusedFirst := issuing.Claim{Directory: secondDirectory, FallbackCause: issuing.FallbackRefused, RefusedBy: testDirectory}
	for _, tc := range []struct {
		name    string
		c       issuing.Claim
		fb      *issuing.Fallback
		refused bool
		allowed issuing.Verdict
		want    issuing.Decision
	}{
		{"first, anything allowed", atFirst, fb, false, nil, issuing.Decision{Directory: testDirectory}},
		{"second for an outage", atSecond, fb, false, nil, issuing.Decision{Directory: secondDirectory, Cause: issuing.FallbackOutage}},
		{"first refused: second at once", atFirst, fb, true, nil, issuing.Decision{Directory: secondDirectory, Cause: issuing.FallbackRefused}},
		{"CAA forbids the first: second at once", atFirst, fb, false, only(secondDirectory), issuing.Decision{Directory: secondDirectory, Cause: issuing.FallbackRefused}},
		{"CAA allows the first only: it waits for the first", atSecond, fb, false, only(testDirectory), issuing.Decision{Wait: true}},
		{"CAA allows neither", atFirst, fb, false, only(), issuing.Decision{}},
		{"first refused, CAA forbids the second", atFirst, fb, true, only(testDirectory), issuing.Decision{}},
		{"refused by the first before, CAA forbids the second", refusedFirst, fb, false, only(testDirectory), issuing.Decision{}},
		{"one CA, refused", atFirst, nil, true, nil, issuing.Decision{}},
		{"one CA", atFirst, nil, false, nil, issuing.Decision{Directory: testDirectory}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, issuing.Decide(tc.c, testDirectory, tc.fb, tc.refused, tc.allowed))
		})
	}
}
