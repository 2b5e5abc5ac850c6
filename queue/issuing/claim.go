package issuing

import "time"

// Claim is a domain this instance has claimed and holds a lease on.
type Claim struct {
	ID       string
	TenantID string
	// Domain as stored; CheckName gives the name to order.
	Domain string
	// Attempts before this one (as stored: may be negative in a hand-edited row).
	Attempts int
	// Token identifies this claim; every write that finishes it checks the token.
	Token string
	// ClaimedAt is the claiming transaction's time.
	ClaimedAt time.Time
	// DueAt is when the row became claimable, or zero when unknown.
	DueAt time.Time
	// CurrentPEM is the stored certificate this order renews, or "".
	CurrentPEM string
	// Profile is the domain's own ACME profile (ssl_profile), nil for --acme-profile.
	Profile *string
	// ProfileRefused is the domain's profile the CA does not offer
	// (ssl_profile_refused), or "".
	ProfileRefused string
	// CertProfile is the stored certificate's profile, or "" when none is recorded.
	CertProfile string
	// FirstIssuance: claimed from tier 2; the domain holds no certificate certworker
	// renews.
	FirstIssuance bool
	// Directory is the ACME directory the claim sent the order to; FallbackCause why it
	// is the second CA, or "".
	Directory     string
	FallbackCause string
	// RefusedBy is the CA that refused the name for good (ssl_ca_refused), or "", and
	// RefusedCause why (RefusedByCAA, RefusedByCA, or "").
	RefusedBy, RefusedCause string
	// CertDirectory is the stored certificate's CA, or "" when none is recorded: the
	// first CA's.
	CertDirectory string
	// Notice is what ssl_error says once the certificate is stored, or "": set when the
	// order renewed under the certificate's profile.
	Notice string
}
