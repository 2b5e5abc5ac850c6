package acme_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/internal/pebbletest"
	"github.com/certworker/certworker/queue/issuing"
)

// An order the CA validated writes the domain's validated event in the statement that
// records the certificate key before the finalize (the event's xmin is the record's),
// with the domain's tenant, and notifies certworker_domain; an order whose challenge
// the CA found invalid writes none. Guards against a validated event that is never
// written, written by a transaction other than the change it records, or written for
// a validation that failed.
func TestIssue_AValidatedOrderWritesTheDomainsValidatedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, pebbletest.Options{}, true)
	front := pebbletest.NewFront(t, b.ca)
	cfg := frontConfig(b, front)
	ctx := testCtx(t, time.Minute)
	var tenant string
	require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO proxy_tenants (name, slug, email)
VALUES ('v', $1, 'o@v.example') RETURNING id::text`, randomName("t")).Scan(&tenant))
	domain := func(name string) string {
		var id string
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO proxy_domains (tenant_id, domain, verification_token, ssl_provider)
VALUES ($1, $2, 'tok', 'acme') RETURNING id::text`, tenant, name).Scan(&id))
		return id
	}
	notes, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer notes.Release()
	_, err = notes.Exec(ctx, `LISTEN certworker_domain`)
	require.NoError(t, err)

	name := randomName("v")
	id := domain(name)
	_, err = newIssuer(t, b.pool, nil, cfg).Issue(ctx, issuing.Request{DomainID: id, TenantID: tenant, Domain: name})
	require.NoError(t, err)
	var event, eventTenant string
	var eventXmin, recordXmin uint32
	require.NoError(t, b.pool.QueryRow(ctx, `
SELECT e.event, e.tenant_id::text, e.xmin::text::bigint, o.xmin::text::bigint
FROM certworker_domain_events e JOIN certworker_orders o ON o.domain_id = e.domain_id
WHERE e.domain_id = $1`, id).Scan(&event, &eventTenant, &eventXmin, &recordXmin))
	require.Equal(t, "validated", event)
	require.Equal(t, tenant, eventTenant)
	require.Equal(t, recordXmin, eventXmin, "the event commits with the key's record")
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := notes.Conn().WaitForNotification(nctx)
	require.NoError(t, err)
	require.Equal(t, id, n.Payload)

	// The CA finds the challenge invalid: no validated event.
	front.Add(pebbletest.Rule{Step: pebbletest.StepChallenge, Times: 1, Answer: pebbletest.Answer{Status: 403,
		Problem: &pebbletest.Problem{Type: "urn:ietf:params:acme:error:unauthorized", Detail: "no"}}})
	failedName := randomName("f")
	failed := domain(failedName)
	_, err = newIssuer(t, b.pool, nil, cfg).Issue(ctx, issuing.Request{DomainID: failed, TenantID: tenant, Domain: failedName})
	require.Error(t, err)
	var events int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM certworker_domain_events WHERE domain_id = $1`, failed).Scan(&events))
	require.Zero(t, events)
}
