package issuing

import (
	"errors"
	"time"
)

// RenewalInfo is what the worker learnt of a stored certificate's renewal window.
type RenewalInfo struct {
	// RenewAt, when not zero, is an earlier renewal time than the stored one: the CA
	// moved its window earlier. A later window never postpones a renewal.
	RenewAt time.Time
	// RenewNow: the CA's window is over; the certificate is due now (the database's
	// now).
	RenewNow bool
	// WindowStart and WindowEnd are the CA's window (zero: none). Past its end the
	// renewal is urgent; inside it, a renewal naming the certificate is exempt from
	// every limit (Admit).
	WindowStart, WindowEnd time.Time
	// NextIn is how long until the CA is asked again, from the database's now; 0
	// stops asking (the CA offers no renewal information).
	NextIn time.Duration
}

// ErrCertificateReplaced: the certificate whose renewal information was read was
// replaced (or its row deleted) while the CA was asked; nothing was written.
var ErrCertificateReplaced = errors.New("the certificate was replaced while its renewal information was read")
