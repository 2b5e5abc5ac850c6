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
	// DueAt is when the row became claimable: when it entered the claimable set, or
	// when its backoff ran out, whichever is later. Zero when unknown.
	DueAt time.Time
	// CurrentPEM is the stored certificate this order renews, or "".
	CurrentPEM string
	// Profile is the domain's own ACME profile (ssl_profile), nil for --acme-profile.
	Profile *string
	// ProfileRefused is the domain's profile the CA does not offer
	// (ssl_profile_refused), or "". The worker sets it when the CA refuses the
	// profile during the order, and clears it when the order used the domain's own.
	ProfileRefused string
	// CertProfile is the profile the stored certificate was issued under, or "" when
	// none is recorded (no certificate, one issued before migration 00014, an upload).
	CertProfile string
	// FirstIssuance: the row was claimed from the first issuances' tier (2): the
	// domain holds no certificate certworker renews (its first issuance, or a retry).
	FirstIssuance bool
	// Directory is the ACME directory of the CA the order goes to, as the claim
	// decided (fallback.go); FallbackCause is why it is the second CA (Fallback*), or
	// "" for the first.
	Directory     string
	FallbackCause string
	// RefusedBy is the directory of the CA that refused the name for good
	// (ssl_ca_refused), or "", and RefusedCause why (ssl_ca_refused_cause:
	// RefusedByCAA, RefusedByCA, or "" for a refusal recorded before it was kept).
	RefusedBy, RefusedCause string
	// CertDirectory is the directory of the CA that issued the stored certificate, or
	// "" when none is recorded (no certificate, one stored before migration 00017, an
	// upload): the first CA's, then.
	CertDirectory string
	// Notice is what ssl_error says of the domain once its certificate is stored
	// (MarkActive), or "" for nothing: set by the worker when it renewed under the
	// certificate's profile because the CA does not offer the domain's own.
	Notice string
}
