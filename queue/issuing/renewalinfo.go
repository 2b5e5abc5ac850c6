package issuing

import (
	"errors"
	"time"
)

// RenewalInfo is what the worker learnt of a stored certificate's renewal window.
type RenewalInfo struct {
	// RenewAt, when not zero, is an earlier renewal time than the stored one; a later
	// window never postpones a renewal.
	RenewAt time.Time
	// RenewNow: the CA's window is over; the certificate is due now.
	RenewNow bool
	// WindowStart and WindowEnd are the CA's window (zero: none).
	WindowStart, WindowEnd time.Time
	// NextIn is how long until the CA is asked again; 0 stops asking.
	NextIn time.Duration
}

// ErrCertificateReplaced: the certificate was replaced or deleted while the CA was
// asked; nothing was written.
var ErrCertificateReplaced = errors.New("the certificate was replaced while its renewal information was read")
