package worker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/acme"
	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/internal/workertest"
	"github.com/certworker/certworker/queue/worker"
)

// What acme's CAA check returns is treated as the rules say: a failed look-up
// (SERVFAIL) is the tenant's DNS, charged like a failed preflight and retried, with
// ssl_error starting "caa:"; records that allow no CA fail the domain at once, naming
// what they allow. Guards the contract between acme.CAAError and the worker
// (CAAError.As), which a change to either side could break silently.
func TestWorker_CAAErrorsAreChargedLikeAPreflightOrFailAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	forbidden := acme.CAAVerdict{Name: "refused.example", Allowed: []bool{false},
		Set:   acme.CAASet{Domain: "refused.example", Records: []acme.CAARecord{{Tag: "issue", Value: "sectigo.com"}}},
		Named: []string{"sectigo.com"}}
	fake := fakeissuer.New(10)
	fake.Fail = func(domain string, _ int) error {
		switch domain {
		case "servfail.example":
			return &acme.CAAError{Msg: "the DNS look-up of the CAA records of servfail.example failed: SERVFAIL"}
		case "refused.example":
			return forbidden.Err()
		}
		return nil
	}
	tn := b.tenant(t)
	servfail := b.named(t, tn, "servfail.example")
	refused := b.named(t, tn, "refused.example")
	in := b.start(t, "w", worker.Config{Issuer: fake, Concurrency: 2, PollInterval: time.Hour})

	b.waitStatus(t, refused, "failed", 10*time.Second)
	r := b.row(t, refused)
	require.NotNil(t, r.Error)
	require.True(t, strings.HasPrefix(*r.Error, "caa: the CAA records of refused.example allow only sectigo.com,"), *r.Error)

	workertest.Eventually(t, 10*time.Second, "the charged look-up", func() bool { return b.row(t, servfail).Attempts == 1 })
	r = b.row(t, servfail)
	require.Equal(t, "pending", b.status(t, servfail))
	require.NotNil(t, r.Error)
	require.Equal(t, "caa: the DNS look-up of the CAA records of servfail.example failed: SERVFAIL", *r.Error)
	// Each outcome is counted once its order is over, after the row's write.
	workertest.Eventually(t, 10*time.Second, "both outcomes counted", func() bool {
		return in.Metric(t, "certworker_issuance_total", "preflight_failed") == 1 &&
			in.Metric(t, "certworker_issuance_total", "permanent") == 1
	})
}
