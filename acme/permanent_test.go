package acme_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// A refusal no retry can fix is *issuing.PermanentError with the CA's problem in the
// message, so that the worker fails the domain at once: Pebble refusing a blocked
// name (rejectedIdentifier, its own text), Let's Encrypt's texts for a name refused
// by policy and for the pause of an account and name (its unpause link in the log,
// TestIssue_UnpauseLinkGoesToTheLogNotTheError), and a CAA refusal at validation.
// Guards against ten orders spent on a name the CA will never issue for, and against
// a paused name retried (or paused) for ever.
func TestIssue_RefusalsNoRetryCanFixArePermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, front *pebbletest.Front, name string)
		want  []string
	}{
		{"name blocked by the CA's policy (Pebble)", func(t *testing.T, _ *pebbletest.Front, name string) {
			require.NoError(t, b.ca.BlockName(name))
		}, []string{"acme: urn:ietf:params:acme:error:rejectedIdentifier: ", "forbidden by policy"}},
		{"name refused by Let's Encrypt's policy", func(t *testing.T, front *pebbletest.Front, name string) {
			front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Answer: pebbletest.RejectedIdentifier(name)})
		}, []string{"acme: urn:ietf:params:acme:error:rejectedIdentifier: Error creating new order :: Cannot issue for "}},
		{"account and name paused by Let's Encrypt", func(t *testing.T, front *pebbletest.Front, name string) {
			front.Add(pebbletest.Rule{Step: pebbletest.StepNewOrder, Names: []string{name}, Answer: pebbletest.Paused(name)})
		}, []string{"an operator must unpause it with the link in certworker's log", "temporarily prevented from requesting certificates for "}},
		{"CAA forbids the CA", func(t *testing.T, front *pebbletest.Front, name string) {
			front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Answer: pebbletest.Answer{Status: http.StatusForbidden,
				Problem: &pebbletest.Problem{Type: "urn:ietf:params:acme:error:caa", Detail: "CAA record for " + name + " prevents issuance"}}})
		}, []string{"acme: urn:ietf:params:acme:error:caa: CAA record for "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			front := pebbletest.NewFront(t, b.ca)
			name := randomName("p")
			tc.setup(t, front, name)
			_, err := newIssuer(t, b.pool, nil, frontConfig(b, front)).Issue(testCtx(t, 30*time.Second), issuing.Request{Domain: name})
			var pe *issuing.PermanentError
			require.ErrorAs(t, err, &pe, "%T: %v", err, err)
			_, isRL := issuing.IsRateLimit(err)
			require.False(t, isRL)
			for _, want := range tc.want {
				require.Contains(t, err.Error(), want)
			}
			require.True(t, strings.Contains(err.Error(), name), "the message names the domain: %v", err)
			var ue *issuing.CAUnavailableError
			require.False(t, errors.As(err, &ue))
		})
	}
}
