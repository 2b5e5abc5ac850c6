package acme

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A request that got no answer is recorded as the CA unreachable, and one whose
// own deadline passed says "no answer in time" whatever error net/http gave for it:
// its transport returns context.DeadlineExceeded or, when the connection noticed
// the cancellation first, "net/http: request canceled". A cancelled order records
// nothing: the order says why it ended, not the CA. Guards against a CA that
// hangs being reported as a plain cancellation in ssl_error and the logs (CI saw
// "request canceled" for a request that timed out).
func TestNoteUnreachable_SaysWhyTheCAGaveNoAnswer(t *testing.T) {
	t.Parallel()
	expired, cancel := context.WithTimeout(context.Background(), -1)
	defer cancel()
	cancelled, cancelOrder := context.WithCancel(context.Background())
	cancelOrder()
	for _, tc := range []struct {
		name     string
		order    context.Context
		request  context.Context
		err      error
		want     string // "" is nothing recorded
		wantTime bool
	}{
		{"deadline exceeded", context.Background(), expired, context.DeadlineExceeded, "POST https://ca.test/authz/1", true},
		{"request canceled after its deadline", context.Background(), expired, errors.New("net/http: request canceled"), "request canceled", true},
		{"a reset", context.Background(), context.Background(), syscall.ECONNRESET, "connection reset", false},
		{"the order cancelled", cancelled, expired, context.Canceled, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &orderTransport{ctx: tc.order}
			req := httptest.NewRequestWithContext(tc.request, http.MethodPost, "https://ca.test/authz/1", nil)
			tr.noteUnreachable(req, tc.err)
			got := tr.unreachable()
			if tc.want == "" {
				require.NoError(t, got)
				return
			}
			require.Error(t, got)
			require.Contains(t, got.Error(), tc.want)
			require.ErrorIs(t, got, tc.err, "the cause is kept")
			require.Equal(t, tc.wantTime, strings.Contains(got.Error(), "no answer in time"), got.Error())
		})
	}
}
