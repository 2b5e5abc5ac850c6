package pebbletest

import (
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Drill is a mass-revocation drill as a CA runs one: the renewal windows
// of chosen certificates move to "now", so that every client following ACME Renewal
// Information (RFC 9773) replaces them at once. Front.StartDrill applies one.
type Drill struct {
	// Serials are the certificates whose windows move; nil is every certificate the
	// CA has issued so far (CA.IssuedSerials at StartDrill; one issued later, a
	// replacement among them, keeps the CA's own window, or the drill would never
	// end).
	Serials []*big.Int
	// Window is how long the moved windows stay open from StartDrill; 0 is an hour.
	Window time.Duration
	// Opened is how long before StartDrill the moved windows opened; 0 opens them at
	// StartDrill. Each window is [StartDrill's time - Opened, that time + Window). A
	// client draws its renewal time inside the window's part still ahead, so a CA that
	// wants every certificate replaced at once opens the windows in the past: certworker
	// renews at once in a window whose first nine tenths are over
	// (issuing.RenewAtFromWindow), and still inside it.
	Opened time.Duration
}

// StartDrill moves the renewal windows of d's certificates to now: from now on the
// front answers their renewal information itself, with the moved window (and the
// Retry-After of SetRenewalInfoRetryAfter, if set), as a CA does when it rehearses a
// mass revocation. It returns the window's start and end. A later call replaces the
// drill.
func (f *Front) StartDrill(d Drill) (start, end time.Time) {
	serials := map[string]bool{}
	if d.Serials == nil {
		for _, s := range f.ca.IssuedSerials() {
			serials[s] = true
		}
	}
	for _, s := range d.Serials {
		serials[s.Text(16)] = true
	}
	if d.Window <= 0 {
		d.Window = time.Hour
	}
	now := time.Now().Truncate(time.Second)
	start, end = now.Add(-d.Opened), now.Add(d.Window)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drill = &drillState{serials: serials, start: start, end: end}
	return start, end
}

// SetRenewalInfoRetryAfter makes every renewal-information answer through the front
// carry Retry-After d (whole seconds; 0 restores the CA's own, Pebble's 6 hours), so
// that a test sees its clients ask again in minutes rather than hours.
func (f *Front) SetRenewalInfoRetryAfter(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ariRetryAfter = d
}

// drillState is the drill in force (Front.drill).
type drillState struct {
	serials    map[string]bool // hex, as CA.IssuedSerials
	start, end time.Time
}

// answerRenewalInfo answers a renewal-information request for a certificate of the
// drill, and reports whether it did.
func (f *Front) answerRenewalInfo(w http.ResponseWriter, r *http.Request) bool {
	serial := ariSerial(strings.TrimPrefix(r.URL.Path, renewalInfoPath))
	f.mu.Lock()
	d, retry := f.drill, f.ariRetryAfter
	f.mu.Unlock()
	if d == nil || serial == "" || !d.serials[serial] {
		return false
	}
	body, _ := json.Marshal(map[string]any{"suggestedWindow": map[string]string{
		"start": d.start.UTC().Format(time.RFC3339), "end": d.end.UTC().Format(time.RFC3339)}})
	if retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(retry/time.Second, 1))))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return true
}

// rewriteRetryAfter sets the Retry-After of a renewal-information answer the CA gave
// (SetRenewalInfoRetryAfter).
func (f *Front) rewriteRetryAfter(resp *http.Response) error {
	if resp.Request == nil || StepOf(resp.Request) != StepRenewalInfo {
		return nil
	}
	f.mu.Lock()
	retry := f.ariRetryAfter
	f.mu.Unlock()
	if retry > 0 && resp.StatusCode == http.StatusOK {
		resp.Header.Set("Retry-After", strconv.Itoa(int(max(retry/time.Second, 1))))
	}
	return nil
}

// ariSerial is the serial number (hex, as CA.IssuedSerials) of the certificate an
// RFC 9773 certificate id names, or "" when it names none.
func ariSerial(certID string) string {
	_, encoded, ok := strings.Cut(certID, ".")
	if !ok {
		return ""
	}
	sn, err := base64.RawURLEncoding.DecodeString(encoded)
	if err != nil || len(sn) == 0 {
		return ""
	}
	return new(big.Int).SetBytes(sn).Text(16)
}
