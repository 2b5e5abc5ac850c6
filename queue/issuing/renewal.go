package issuing

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"time"
)

// ShortLived is the lifetime below which a certificate renews at half its lifetime
// instead of two thirds, leaving a 6-day certificate 3 days for a failed renewal
// (docs/cas.md).
const ShortLived = 10 * 24 * time.Hour

// RenewAtFromValidity is the renewal time of a certificate without ACME Renewal
// Information: when a third of its lifetime remains, or half below ShortLived.
// requeueDue inverts this rule in SQL, and the two have to agree.
func RenewAtFromValidity(notBefore, notAfter time.Time) time.Time {
	lifetime := notAfter.Sub(notBefore)
	if lifetime < ShortLived {
		return notAfter.Add(-lifetime / 2)
	}
	return notAfter.Add(-lifetime / 3)
}

// BadRow is a row the worker cannot use as it is. The pass that first meets it deals
// with it and returns it once, for the caller to log and count.
type BadRow struct {
	// ID is the domain's id, or "" for a certificate row without a domain.
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
