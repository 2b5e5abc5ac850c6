// Package legacydb is a test fixture: the proxy's database as the reference worker
// left it, for testing `certworker migrate` and the worker on the database they will
// really meet, not a fresh one.
//
// The tables are the proxy's (docs/reference.md, "The proxy's tables") without their CHECK constraints and without any of
// certworker's columns; proxy_certificates has certificate_pem, private_key_pem, a
// nullable expires_at and auto_renew. The rows are 100,000 domains (by default) of
// 1,000 tenants, in every state the reference and the proxy leave behind: active with
// a certificate (some with a NULL expires_at, some due for renewal, some expired),
// pending and never tried, backing off, failed at the attempt limit, unverified,
// manual and none, and claimed by the old worker (provisioning, no lease, claimed 0 to
// 30 minutes ago). Plus a few odd rows at known names (Odd), and certificate rows of
// domains the proxy has deleted.
//
// Every value is in the contract's sets: a test that needs a row outside them writes
// it itself.
package legacydb

// Schema is the proxy's tables as the reference worker knew them.
const Schema = `
CREATE TABLE proxy_tenants (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name       text NOT NULL,
    slug       text NOT NULL UNIQUE,
    email      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE proxy_domains (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id           uuid NOT NULL REFERENCES proxy_tenants (id) ON DELETE CASCADE,
    domain              text NOT NULL UNIQUE,
    verification_status text NOT NULL DEFAULT 'pending',
    verification_method text NOT NULL DEFAULT 'dns',
    verification_token  text NOT NULL,
    ssl_status          text NOT NULL DEFAULT 'pending',
    ssl_provider        text NOT NULL DEFAULT 'acme',
    ssl_attempts        integer NOT NULL DEFAULT 0,
    ssl_last_attempt_at timestamptz,
    ssl_error           text,
    ssl_expires_at      timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE proxy_certificates (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    domain          text NOT NULL UNIQUE,
    certificate_pem text NOT NULL,
    private_key_pem text NOT NULL,
    expires_at      timestamptz,
    auto_renew      boolean NOT NULL DEFAULT true,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
`

// Options size the fixture.
type Options struct {
	// Domains is how many domains (default 100,000), besides the odd rows.
	Domains int
	// Tenants is how many tenants share them (default 1,000).
	Tenants int
}

func (o Options) withDefaults() Options {
	if o.Domains <= 0 {
		o.Domains = 100_000
	}
	if o.Tenants <= 0 {
		o.Tenants = 1_000
	}
	return o
}

// Names of the odd rows, each verified and acme.
const (
	// CaseDuplicate and CaseDuplicateUpper differ only in case; both pending.
	CaseDuplicate      = "case-dup.fixture.example"
	CaseDuplicateUpper = "Case-Dup.fixture.example"
	// Unparsable is active, with a certificate_pem that is not a certificate.
	Unparsable = "unparsable.fixture.example"
	// Misnamed is active, with a certificate for another name.
	Misnamed = "misnamed.fixture.example"
	// Negative is pending with ssl_attempts -3 (a hand edit).
	Negative = "negative.fixture.example"
	// Huge is pending with ssl_attempts at the top of int4.
	Huge = "huge.fixture.example"
)

// DeletedDomains is how many certificate rows belong to domains the proxy deleted.
const DeletedDomains = 10

// Provisioning is how many domains the old worker left in 'provisioning' (per
// 100,000): claimed 0 to 30 minutes ago, without a lease.
const Provisioning = 100
