package pebbletest

import (
	"net/http"
	"strings"
)

// Step is the kind of request a client makes to the CA, named after the ACME
// resource it goes to (RFC 8555 §7.1). Requests are counted by step
// (CA.Requests), and a Front answers chosen steps itself.
type Step string

// Pebble's paths differ from Boulder's on purpose (to catch clients that do not
// follow the directory); these are Pebble's.
const (
	StepDirectory     Step = "directory"     // GET /dir
	StepNonce         Step = "new-nonce"     // HEAD or GET /nonce-plz
	StepNewAccount    Step = "new-account"   // POST /sign-me-up
	StepAccount       Step = "account"       // POST /my-account/…
	StepNewOrder      Step = "new-order"     // POST /order-plz
	StepOrder         Step = "order"         // POST-as-GET /my-order/…
	StepAuthorization Step = "authorization" // POST /authZ/… (a fetch or a deactivation)
	StepChallenge     Step = "challenge"     // POST /chalZ/…
	StepFinalize      Step = "finalize"      // POST /finalize-order/…
	StepCertificate   Step = "certificate"   // POST-as-GET /certZ/…
	StepRenewalInfo   Step = "renewal-info"  // GET of ACME Renewal Information
	StepOther         Step = "other"         // anything else
)

// stepPrefixes maps Pebble's path prefixes to steps. Order matters only where a
// prefix is a prefix of another, which none is.
var stepPrefixes = []struct {
	prefix string
	step   Step
}{
	{DirectoryPath, StepDirectory},
	{"/nonce-plz", StepNonce},
	{NewAccountPath, StepNewAccount},
	{"/my-account/", StepAccount},
	{NewOrderPath, StepNewOrder},
	{"/my-order/", StepOrder},
	{"/authZ/", StepAuthorization},
	{challengePath, StepChallenge},
	{"/finalize-order/", StepFinalize},
	{certificatePath, StepCertificate},
	{renewalInfoPath, StepRenewalInfo},
}

// renewalInfoPath is where Pebble serves ACME Renewal Information.
const renewalInfoPath = "/draft-ietf-acme-ari-03/renewalInfo/"

// StepOf names the step of a request to Pebble (or to a Front before it).
func StepOf(r *http.Request) Step {
	for _, p := range stepPrefixes {
		if r.URL.Path == p.prefix || strings.HasPrefix(r.URL.Path, p.prefix) && strings.HasSuffix(p.prefix, "/") {
			return p.step
		}
	}
	return StepOther
}
