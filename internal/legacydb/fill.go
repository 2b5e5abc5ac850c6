package legacydb

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	"github.com/jackc/pgx/v5"
)

// Fill creates the schema and the rows in the empty database conn is connected to.
func Fill(ctx context.Context, conn *pgx.Conn, opts Options) error {
	opts = opts.withDefaults()
	if _, err := conn.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("create the reference's tables: %w", err)
	}
	certs, err := newCertificates(time.Now())
	if err != nil {
		return err
	}
	steps := []struct {
		what string
		sql  string
		args []any
	}{
		{"tenants", tenantsSQL, []any{opts.Tenants}},
		{"domains", domainsSQL, []any{opts.Domains, opts.Tenants, certs.notAfters}},
		{"certificates", certificatesSQL, []any{certs.pems, certs.notAfters, certs.key}},
		{"odd rows", oddRowsSQL, []any{
			CaseDuplicate, CaseDuplicateUpper, Unparsable, Misnamed, Negative, Huge,
			certs.misnamed, certs.key, certs.notAfters[0], DeletedDomains, certs.pems[0],
		}},
		{"statistics", `ANALYZE`, nil},
	}
	for _, s := range steps {
		if _, err := conn.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("insert the fixture's %s: %w", s.what, err)
		}
	}
	return nil
}

// DomainID is the id of the fixture's ith domain (from 1): d<i>.fixture.example.
func DomainID(i int) string { return fmt.Sprintf("00000000-0000-4000-a000-%012x", i) }

// TenantID is the id of the fixture's ith tenant (from 1).
func TenantID(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012x", i) }

const tenantsSQL = `
INSERT INTO proxy_tenants (id, name, slug, email, created_at, updated_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(t), 12, '0'))::uuid,
       'Tenant ' || t, 'tenant-' || t, 'ops@tenant-' || t || '.example',
       now() - interval '3 years', now() - interval '1 year'
FROM generate_series(1, $1) t`

// domainsSQL spreads the domains over the states by i % 100 (so every tenant has some
// of each): 60% active, 10% pending and never tried, 8% backing off, 4% failed at the
// limit, 8% unverified, 4% manual, 2% none, 3% more active, and the last 1% active
// but for one in ten, which the old worker claimed. Active domains hold certificate
// i % 4 ($3 holds their expiries).
const domainsSQL = `
INSERT INTO proxy_domains (id, tenant_id, domain, verification_status, verification_method,
    verification_token, ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at, ssl_error,
    ssl_expires_at, created_at, updated_at)
SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(i), 12, '0'))::uuid,
       ('00000000-0000-4000-8000-' || lpad(to_hex(1 + i % $2), 12, '0'))::uuid,
       'd' || i || '.fixture.example',
       CASE WHEN k BETWEEN 82 AND 85 THEN 'pending' WHEN k BETWEEN 86 AND 89 THEN 'failed' ELSE 'verified' END,
       CASE WHEN i % 2 = 0 THEN 'dns' ELSE 'http' END,
       md5(i::text),
       CASE WHEN k < 60 OR k BETWEEN 90 AND 93 OR k BETWEEN 96 AND 98 THEN 'active'
            WHEN k = 99 AND (i / 100) % 10 = 0 THEN 'provisioning'
            WHEN k = 99 THEN 'active'
            WHEN k BETWEEN 78 AND 81 THEN 'failed'
            ELSE 'pending' END,
       CASE WHEN k BETWEEN 90 AND 93 THEN 'manual' WHEN k IN (94, 95) THEN 'none' ELSE 'acme' END,
       CASE WHEN k BETWEEN 70 AND 77 THEN 1 + i % 9 WHEN k BETWEEN 78 AND 81 THEN 10 ELSE 0 END,
       CASE WHEN k BETWEEN 60 AND 69 OR k BETWEEN 82 AND 95 THEN NULL
            WHEN k BETWEEN 70 AND 81 THEN now() - (i % 240) * interval '1 minute'
            WHEN k = 99 AND (i / 100) % 10 = 0 THEN now() - ((i / 1000) % 31) * interval '1 minute'
            ELSE now() - (10 + i % 60) * interval '1 day' END,
       CASE WHEN k BETWEEN 70 AND 77 THEN 'acme: error: 400 :: urn:ietf:params:acme:error:connection :: Connection refused'
            WHEN k BETWEEN 78 AND 81 THEN 'acme: error: 400 :: urn:ietf:params:acme:error:dns :: NXDOMAIN looking up A'
       END,
       CASE WHEN k < 60 OR k BETWEEN 90 AND 93 OR k BETWEEN 96 AND 99 THEN ($3::timestamptz[])[1 + i % 4] END,
       now() - interval '2 years',
       now() - (i % 1000) * interval '1 minute'
FROM generate_series(1, $1) i, LATERAL (SELECT i % 100 AS k) s`

// certificatesSQL stores a certificate for every domain that is active: the
// reference's for acme ones, the tenant's for manual ones (auto_renew off). One in
// seven has a NULL expires_at, as the reference wrote when it did not know it; one
// acme certificate in fifty has auto_renew turned off by its tenant.
const certificatesSQL = `
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, auto_renew,
    created_at, updated_at)
SELECT d.domain,
       ($1::text[])[1 + n % 4],
       $3,
       CASE WHEN n % 7 = 0 THEN NULL ELSE ($2::timestamptz[])[1 + n % 4] END,
       d.ssl_provider = 'acme' AND n % 50 <> 0,
       COALESCE(d.ssl_last_attempt_at, d.created_at), COALESCE(d.ssl_last_attempt_at, d.created_at)
FROM proxy_domains d, LATERAL (SELECT split_part(substr(d.domain, 2), '.', 1)::int AS n) s
WHERE d.ssl_status = 'active'`

// oddRowsSQL adds the odd rows to tenant 1, and certificates of deleted domains.
const oddRowsSQL = `
WITH odd (domain, status, attempts) AS (VALUES
    ($1::text, 'pending', 0), ($2, 'pending', 0), ($3, 'active', 0), ($4, 'active', 0),
    ($5, 'pending', -3), ($6, 'pending', 2147483647)),
domains AS (
    INSERT INTO proxy_domains (tenant_id, domain, verification_status, verification_token,
        ssl_status, ssl_provider, ssl_attempts, ssl_last_attempt_at)
    SELECT '00000000-0000-4000-8000-000000000001', domain, 'verified', 'tok', status, 'acme',
           attempts, CASE WHEN attempts <> 0 THEN now() - interval '1 day' END
    FROM odd RETURNING domain)
INSERT INTO proxy_certificates (domain, certificate_pem, private_key_pem, expires_at, updated_at)
SELECT $3, E'-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n', $8::text,
       $9::timestamptz, now() - interval '10 days'
UNION ALL SELECT $4, $7, $8, $9, now() - interval '10 days'
UNION ALL SELECT 'deleted-' || g || '.fixture.example', $11, $8, $9, now() - interval '30 days'
FROM generate_series(1, $10) g`

// certificates are what the fixture's rows hold: real certificates for
// *.fixture.example from a fixture CA, so that the worker can parse them and finds
// its domain's name in them.
type certificates struct {
	// pems and notAfters: 90 days, 10 days in (renewed in 50 days); 90 days, 70 in
	// (due); 90 days, expired 5 days ago; 6 days, 1 in.
	pems      []string
	notAfters []time.Time
	// misnamed is for elsewhere.example.
	misnamed string
	// key is a private key in PEM: one for every row, which is all a fixture needs.
	key string
}

func newCertificates(now time.Time) (*certificates, error) {
	now = now.Truncate(time.Second)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "Legacy fixture CA"},
		NotBefore:             now.Add(-5 * 365 * 24 * time.Hour),
		NotAfter:              now.Add(5 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return nil, err
	}
	c := &certificates{key: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))}
	const day = 24 * time.Hour
	mint := func(serial int64, name string, notBefore time.Time, lifetime time.Duration) (string, error) {
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			DNSNames:     []string{name},
			NotBefore:    notBefore,
			NotAfter:     notBefore.Add(lifetime),
		}, ca, &leafKey.PublicKey, caKey)
		if err != nil {
			return "", fmt.Errorf("mint the fixture's certificates: %w", err)
		}
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
	}
	for i, v := range []struct {
		ago, lifetime time.Duration
	}{{10 * day, 90 * day}, {70 * day, 90 * day}, {95 * day, 90 * day}, {day, 6 * day}} {
		p, err := mint(int64(100+i), "*.fixture.example", now.Add(-v.ago), v.lifetime)
		if err != nil {
			return nil, err
		}
		c.pems = append(c.pems, p)
		c.notAfters = append(c.notAfters, now.Add(-v.ago+v.lifetime))
	}
	c.misnamed, err = mint(200, "elsewhere.example", now.Add(-10*day), 90*day)
	if err != nil {
		return nil, err
	}
	return c, nil
}
