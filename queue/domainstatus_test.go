package queue_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// statusOf is certworker_domain_status's state, reason and message of id for tenant,
// as the proxy calls it.
func (b *bundle) statusOf(t *testing.T, id, tenant string) (state string, reason, message *string, next *time.Time) {
	t.Helper()
	s, err := b.q.DomainStatus(b.ctx, id, tenant)
	require.NoError(t, err)
	require.NotNil(t, s, "no status row for %s of %s", id, tenant)
	return s.State, s.Reason, s.Message, s.NextCheckAt
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// Each state and reason of certworker_domain_status, from rows as the worker leaves
// them (docs/domain-status.md): a table of fixtures and what the proxy is told.
func TestDomainStatus_StatesAndReasons(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	b.exec(t, `INSERT INTO certworker_settings (id, max_attempts, retry_base_seconds, retry_max_seconds)
VALUES (true, 5, 60, 3600)`)
	require.NoError(t, b.q.RecordDNSTarget(b.ctx, "edge.proxy.example")) // as run records --dns-target
	mk := func(name string, set string) string {
		id := b.named(t, tenant, name)
		if set != "" {
			b.exec(t, `UPDATE proxy_domains SET `+set+` WHERE id = $1`, id)
		}
		return id
	}
	cert := func(name string) {
		b.exec(t, `INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at)
VALUES ($1, 'chain', 'key', now() + interval '60 days')`, name)
	}
	cases := []struct {
		name, set     string
		withCert      bool
		state, reason string
	}{
		{"unverified.example", "verification_status = 'pending'", false, "not_managed", "<nil>"},
		{"manual.example", "ssl_provider = 'manual'", false, "not_managed", "<nil>"},
		{"queued.example", "", false, "queued", "<nil>"},
		{"retrying.example", "ssl_attempts = 2, ssl_error = 'urn:ietf:params:acme:error:connection: timeout', ssl_last_attempt_at = now()", false, "queued", "validation_failed"},
		{"issuing.example", "ssl_status = 'provisioning'", false, "issuing", "<nil>"},
		{"renewing-now.example", "ssl_status = 'provisioning'", true, "renewing", "<nil>"},
		{"renewing.example", "ssl_error = 'renewal information says replace now'", true, "renewing", "<nil>"},
		{"issued.example", "ssl_status = 'active'", true, "issued", "<nil>"},
		{"profile.example", "ssl_status = 'active', ssl_error = 'profile: the CA does not offer shortlived'", true, "issued", "profile_unavailable"},
		{"waiting.example", "ssl_error = 'waiting for DNS: no such name; to be issued, point waiting.example at edge.proxy.example (CNAME)'", false, "waiting_for_dns", "dns_not_pointed"},
		{"*.wild.example", "ssl_error = 'waiting for DNS: no CNAME; to be issued, set _acme-challenge.wild.example CNAME x.acme.example'", false, "waiting_for_dns", "cname_missing"},
		{"caa.example", "ssl_status = 'failed', ssl_attempts = 1, ssl_error = 'caa: the CAA records of caa.example allow only other.example'", false, "failed", "caa_forbids"},
		{"invalid.example", "ssl_status = 'failed', ssl_attempts = 1, ssl_error = 'invalid domain: a label is empty'", false, "failed", "invalid_name"},
		{"dup.example", "ssl_status = 'failed', ssl_error = 'duplicate domain: the name is held'", false, "failed", "duplicate"},
		{"exhausted.example", "ssl_status = 'failed', ssl_attempts = 5, ssl_error = 'urn:ietf:params:acme:error:unauthorized: 404'", false, "failed", "too_many_failures"},
		{"givenup.example", "ssl_status = 'failed', ssl_attempts = 12, ssl_error = 'x (given up: 12 attempts, at or above --max-attempts 5; `certworker retry` puts it back)'", false, "failed", "too_many_failures"},
		{"validation.example", "ssl_status = 'failed', ssl_attempts = 1, ssl_error = 'urn:ietf:params:acme:error:rejectedIdentifier: no'", false, "failed", "validation_failed"},
	}
	for _, c := range cases {
		id := mk(c.name, c.set)
		if c.withCert {
			cert(c.name)
		}
		state, reason, _, _ := b.statusOf(t, id, tenant)
		require.Equal(t, []string{c.state, c.reason}, []string{state, deref(reason)}, c.name)
	}

	// A retry's next check is its backoff's end, by the fleet's recorded settings
	// (60 s * 2^2).
	r, err := b.q.DomainStatus(b.ctx, b.lookupID(t, "retrying.example"), tenant)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(240*time.Second), *r.NextCheckAt, 30*time.Second)
	require.Equal(t, "edge.proxy.example", r.PointTo)
	require.Nil(t, r.CNAMETarget, "DNS-01 is off")

	// A pause of the registered domain holds a pending domain: waiting_for_ca, its end
	// the next check, and the CA's own words (which may name another tenant's
	// domain) not shown.
	held := mk("a.held.example", "")
	b.exec(t, `INSERT INTO certworker_pauses (scope, key, source, paused_until, reason)
VALUES ('registered_domain', 'held.example', 'rate_limit', now() + interval '1 hour', 'too many certificates already issued for secret-other-tenant.held.example')`)
	state, reason, message, next := b.statusOf(t, held, tenant)
	require.Equal(t, []string{"waiting_for_ca", "rate_limited"}, []string{state, deref(reason)})
	require.NotContains(t, deref(message), "secret-other-tenant")
	require.WithinDuration(t, time.Now().Add(time.Hour), *next, time.Minute)
	b.exec(t, `INSERT INTO certworker_pauses (scope, key, source, paused_until, reason)
VALUES ('ca', 'https://ca.invalid/directory', 'unreachable', now() + interval '2 hours', 'dial tcp: refused')`)
	_, reason, _, _ = b.statusOf(t, held, tenant)
	require.Equal(t, "ca_unavailable", deref(reason), "the pause that ends last")

}

// lookupID is the id of the domain called name.
func (b *bundle) lookupID(t *testing.T, name string) string {
	t.Helper()
	var id string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT id::text FROM proxy_domains WHERE domain = $1`, name).Scan(&id))
	return id
}

// Another tenant's domain, or an unknown id, gives no row of status or history:
// a tenant never learns anything of another's domains. The history shows only the
// events written while the domain was this tenant's.
func TestDomainStatus_TenantRule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	owner, other := b.tenant(t), b.tenant(t)
	id := b.named(t, owner, "mine.example")
	b.exec(t, `SELECT certworker_domain_event($1, $2, 'claimed', NULL, NULL, now())`, id, owner)

	s, err := b.q.DomainStatus(b.ctx, id, other)
	require.NoError(t, err)
	require.Nil(t, s, "another tenant's domain")
	s, err = b.q.DomainStatus(b.ctx, uuid.NewString(), owner)
	require.NoError(t, err)
	require.Nil(t, s, "an unknown id")
	events, err := b.q.Events(b.ctx, id, other, 10)
	require.NoError(t, err)
	require.Empty(t, events)
	since, err := b.q.EventsSince(b.ctx, other, 0, 10)
	require.NoError(t, err)
	require.Empty(t, since)

	events, err = b.q.Events(b.ctx, id, owner, 10)
	require.NoError(t, err)
	require.Len(t, events, 1)

	// Moved to the other tenant: the new one sees the domain, not the old history.
	b.exec(t, `UPDATE proxy_domains SET tenant_id = $2 WHERE id = $1`, id, other)
	events, err = b.q.Events(b.ctx, id, other, 10)
	require.NoError(t, err)
	require.Empty(t, events)
	events, err = b.q.Events(b.ctx, id, owner, 10)
	require.NoError(t, err)
	require.Empty(t, events, "no longer the owner's domain")
}

// The history is newest first and limited; the tenant's events since an id are
// oldest first, from after that id; a repeat (same event and reason) counts up the
// newest row instead of adding one.
func TestDomainEvents_OrderLimitSinceAndRepeats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenant := b.tenant(t)
	a, c := b.named(t, tenant, "a.example"), b.named(t, tenant, "c.example")
	ev := func(id, event string, reason any) {
		b.exec(t, `SELECT certworker_domain_event($1, $2, $3, $4, 'msg', clock_timestamp())`, id, tenant, event, reason)
	}
	ev(a, "claimed", nil)
	ev(a, "waiting_for_dns", "dns_not_pointed")
	ev(c, "claimed", nil)
	ev(a, "waiting_for_dns", "dns_not_pointed") // a repeat: a's newest is this event
	ev(a, "waiting_for_dns", "cname_missing")   // another reason: a row of its own

	events, err := b.q.Events(b.ctx, a, tenant, 0)
	require.NoError(t, err)
	require.Len(t, events, 3)
	require.Equal(t, []string{"waiting_for_dns", "waiting_for_dns", "claimed"}, []string{events[0].Event, events[1].Event, events[2].Event})
	require.Equal(t, "cname_missing", *events[0].Reason)
	require.Equal(t, 2, events[1].Count, "the repeat counted up")
	require.True(t, events[1].LastAt.After(events[1].At))
	require.Greater(t, events[0].ID, events[1].ID)

	limited, err := b.q.Events(b.ctx, a, tenant, 1)
	require.NoError(t, err)
	require.Len(t, limited, 1)
	require.Equal(t, events[0].ID, limited[0].ID)

	all, err := b.q.EventsSince(b.ctx, tenant, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 4)
	for i := 1; i < len(all); i++ {
		require.Greater(t, all[i].ID, all[i-1].ID)
	}
	after, err := b.q.EventsSince(b.ctx, tenant, all[1].ID, 1)
	require.NoError(t, err)
	require.Len(t, after, 1)
	require.Equal(t, all[2].ID, after[0].ID)
	require.Equal(t, c, all[2].DomainID)
}
