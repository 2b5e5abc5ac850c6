package issuing

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"time"
)

// ShortLived is the lifetime below which a certificate renews at half its lifetime
// instead of at two thirds (docs/cas.md, renewal times). Let's Encrypt advises renewing its 6-day
// (160 h) certificates every 2 to 3 days: at two thirds a 6-day certificate would
// have 2 days left for a failed renewal to be noticed and fixed, at half it has 3.
// Its 45-day and 90-day profiles stay at two thirds (15 and 30 days left). Ten days
// sits between the two kinds, far from either.
const ShortLived = 10 * 24 * time.Hour

// RenewAtFromValidity is the renewal time of a certificate whose CA gives no ACME
// Renewal Information: when a third of its lifetime remains for a lifetime of 10 days
// or more (a 90-day certificate renews after 60 days), when half remains for a
// shorter one (a 6-day certificate after 3). The reference's fixed "30 days before
// expiry" renewed any certificate shorter than 30 days on every poll. requeueDue
// inverts this rule in SQL, and the two have to agree.
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	lifetime := notAfter.Sub(notBefore)
	if lifetime < ShortLived {
		return notAfter.Add(-lifetime / 2)
	}
	return notAfter.Add(-lifetime / 3)
}

// BadRow is a row the worker cannot use as it is. The pass that first meets it deals
// with it (each method says how) and returns it, once: the caller logs it and counts
// it, and later passes do not return it again. Other rows carry on.
type BadRow struct {
	// ID is the domain's id (proxy_domains.id), or "" for a certificate row whose
	// domain does not exist.
	ID string
	// TenantID is the domain's tenant, or "" with no domain.
	TenantID string
	Domain   string
	Reason   string
}

// RenewalPass is what MarkRenewals did.
type RenewalPass struct {
	// Marked is how many domains went back to 'pending' for a new certificate.
	Marked int64
	// Bad are the certificate rows it could not use, each due for issuance now.
	Bad []BadRow
}

// LeafFromPEM parses the first certificate of a PEM chain.
func LeafFromPEM(chain string) (*x509.Certificate, error) {
	rest := []byte(chain)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no certificate in PEM")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}
