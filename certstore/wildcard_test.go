package certstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/certworker/certworker/certstore"
)

// A wildcard's certificate is served for any name one label below its base (as TLS
// matching does), never for the base itself nor two labels down, and not for a name
// that has a verified row of its own, whatever its tenant: that name is served its
// own certificate or none; an unverified row of its own does not hold the wildcard
// back. A wildcard stored later is served to names already missed.
// Guards against a tenant's *.shop.example answering for a name another tenant
// verified, and against a name's own certificate losing to a wildcard.
func TestStore_WildcardServesOneLabelBelowItsBaseUnlessTheNameHasAVerifiedRow(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: time.Minute})
	b.requireRefused(t, "late.shop.example", certstore.ErrUnknownName)
	wild := b.served(t, "*.shop.example")

	b.requireServes(t, "www.shop.example", wild.serial)
	b.requireServes(t, "API.Shop.Example", wild.serial)
	b.waitServes(t, "late.shop.example", wild.serial, 5*time.Second) // its miss was notified
	b.requireRefused(t, "shop.example", certstore.ErrUnknownName)
	b.requireRefused(t, "a.b.shop.example", certstore.ErrUnknownName)

	own := b.served(t, "own.shop.example")
	b.requireServes(t, "own.shop.example", own.serial)

	// Another tenant's verified row with no certificate: served nothing.
	var other string
	require.NoError(t, b.admin.QueryRow(b.ctx, `INSERT INTO proxy_tenants (name, slug, email) VALUES ('o', $1, 'o@o.example') RETURNING id`,
		fmt.Sprintf("o-%d", time.Now().UnixNano())).Scan(&other))
	_, err := b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
VALUES ($1, 'taken.shop.example', 'verified', 'tok', 'acme', 'pending'),
       ($1, 'pending.shop.example', 'pending', 'tok', 'acme', 'pending')`, other)
	require.NoError(t, err)
	b.requireRefused(t, "taken.shop.example", certstore.ErrNoCertificate)
	b.requireServes(t, "pending.shop.example", wild.serial)

	// A renewal of the wildcard reaches the names it serves at once.
	renewed := b.ca.valid(t, "*.shop.example")
	b.storeCert(t, b.admin, "*.shop.example", renewed)
	b.waitServes(t, "www.shop.example", renewed.serial, 5*time.Second)
}

// A name served the wildcard's certificate stops being served it the moment a row of
// its own becomes verified, whatever its tenant (here another tenant's, inserted
// pending and then verified, and a third inserted verified), not when its cache entry
// is checked again (an hour here): it is then served its own certificate or none.
func TestStore_ANameVerifiedUnderAWildcardStopsBeingServedTheWildcardAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, certstore.Options{TTL: long, MissTTL: long})
	wild := b.served(t, "*.shop.example")
	b.requireServes(t, "later.shop.example", wild.serial)
	b.requireServes(t, "fresh.shop.example", wild.serial)
	b.requireServes(t, "tenants.shop.example", wild.serial)

	var other string
	require.NoError(t, b.admin.QueryRow(b.ctx, `INSERT INTO proxy_tenants (name, slug, email) VALUES ('o', $1, 'o@o.example') RETURNING id`,
		fmt.Sprintf("o-%d", time.Now().UnixNano())).Scan(&other))
	_, err := b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
VALUES ($1, 'later.shop.example', 'pending', 'tok', 'acme', 'pending')`, other)
	require.NoError(t, err)
	b.requireServes(t, "later.shop.example", wild.serial) // an unverified row holds nothing back
	_, err = b.admin.Exec(b.ctx, `UPDATE proxy_domains SET verification_status = 'verified' WHERE domain = 'later.shop.example'`)
	require.NoError(t, err)
	b.waitRefused(t, "later.shop.example", certstore.ErrNoCertificate, 5*time.Second)

	_, err = b.admin.Exec(b.ctx, `
INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token, ssl_provider, ssl_status)
VALUES ($1, 'Fresh.Shop.Example', 'verified', 'tok', 'acme', 'pending')`, other)
	require.NoError(t, err)
	b.waitRefused(t, "fresh.shop.example", certstore.ErrNoCertificate, 5*time.Second)
	b.requireServes(t, "tenants.shop.example", wild.serial)
}
