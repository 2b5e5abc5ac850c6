package worker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/fakeissuer"
	"github.com/certworker/certworker/queue/issuing"
	"github.com/certworker/certworker/queue/worker"
)

// failing is a fake issuer that fails name's orders with err and issues the others.
func failing(name string, err error) *fakeissuer.Issuer {
	fake := fakeissuer.New(10)
	fake.Fail = func(domain string, _ int) error {
		if domain == name {
			return err
		}
		return nil
	}
	return fake
}

// A CA's problem whose detail holds a NUL byte, or bytes that are not UTF-8, is
// recorded sanitised, and the domain after it in line, on an instance with one slot,
// is ordered. The failure write failed with 22021 and was retried for ever, while the
// heartbeat kept its lease: the slot was held, and the next domain waited past 60 s.
func TestWorker_ACAProblemThatTheDatabaseCannotStoreAsItIsFreesTheSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		err     error
		want    string
		status  string
		attempt int
	}{
		{"a NUL in a problem charged", errors.New("acme: urn:ietf:params:acme:error:connection: refused\x00 by peer"),
			"acme: urn:ietf:params:acme:error:connection: refused by peer", "pending", 1},
		{"invalid UTF-8 in a refusal for good", &issuing.PermanentError{Err: errors.New("acme: urn:ietf:params:acme:error:rejectedIdentifier: caf\xe9")},
			`acme: urn:ietf:params:acme:error:rejectedIdentifier: caf\xE9`, "failed", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tn := b.tenant(t)
			bad, badName := b.domain(t, tn)
			next, _ := b.domain(t, tn)
			b.start(t, "w", worker.Config{Issuer: failing(badName, tc.err), Concurrency: 1, PollInterval: time.Second})
			b.waitStatus(t, next, "active", 60*time.Second)
			b.waitStatus(t, bad, tc.status, 10*time.Second)
			r := b.row(t, bad)
			require.Equal(t, tc.want, *r.Error)
			require.Equal(t, tc.attempt, r.Attempts)
			require.Nil(t, r.Token, "the claim was kept")
		})
	}
}

// A failure write the database refuses for what it holds (an integrity constraint
// the proxy's database adds, here on ssl_error) is not retried as it is: it is made
// once more with a generic reason, which is charged, and the slot is freed. It was
// retried for ever.
func TestWorker_AFailureTheDatabaseRefusesIsChargedWithAGenericReason(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `
ALTER TABLE proxy_domains ADD CONSTRAINT no_internal_names CHECK (ssl_error NOT LIKE '%corp.internal%')`)
	require.NoError(t, err)
	tn := b.tenant(t)
	bad, badName := b.domain(t, tn)
	next, _ := b.domain(t, tn)
	in := b.start(t, "w", worker.Config{Issuer: failing(badName, errors.New("acme: dial tcp: lookup ns1.corp.internal")),
		Concurrency: 1, PollInterval: time.Second})
	b.waitStatus(t, next, "active", 60*time.Second)
	r := b.row(t, bad)
	require.Equal(t, "pending", r.Status)
	require.Equal(t, 1, r.Attempts)
	require.Nil(t, r.Token)
	require.Equal(t, "the order failed, and its error could not be recorded as it was (the database refused its text); the details are in certworker's log", *r.Error)
	require.Len(t, in.Logs.FilterMessage("could not record the result: the database refuses it as it is; not retried").All(), 1)
}
