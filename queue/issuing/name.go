package issuing

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// InvalidDomainPrefix starts the ssl_error of a domain whose name no public CA can
// issue for: CheckName says which names those are.
const InvalidDomainPrefix = "invalid domain: "

// CheckName returns the name to order for a stored domain, in lower case, or an error
// saying why no public CA can issue for it: only ASCII host names (A-labels) with at
// least two labels, each 1 to 63 letters, digits or inner hyphens, 253 characters in
// all, no trailing dot, no wildcard, no IP address, nothing under a special-use domain
// (specialUse).
//
// Checked before an order is placed, so a name the CA would refuse never spends a
// rate-limited order, and a row the proxy wrote badly fails with a reason instead of
// being retried for a day.
func CheckName(name string) (string, error) { return CheckNameFor(name, false) }

// CheckNameFor is CheckName, with wildcards valid when wildcards is set (the worker
// runs with --dns01-zone): a first label "*" followed by a name that is
// valid on its own (*.shop.example; never *.example, a public suffix's every name,
// since a valid base needs two labels, nor a "*" deeper than the first label).
func CheckNameFor(name string, wildcards bool) (string, error) {
	if base, ok := strings.CutPrefix(name, "*."); ok && wildcards {
		if strings.HasPrefix(base, "*.") {
			return "", errors.New("a wildcard below a wildcard")
		}
		b, err := checkName(base)
		if err != nil {
			return "", fmt.Errorf("wildcard base: %w", err)
		}
		return "*." + b, nil
	}
	return checkName(name)
}

func checkName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name")
	}
	if len(name) > 253 {
		return "", fmt.Errorf("%d characters, more than 253", len(name))
	}
	if strings.HasSuffix(name, ".") {
		return "", errors.New("trailing dot")
	}
	if _, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return "", errors.New("an IP address, not a host name")
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return "", errors.New("a single label; a public name has at least two")
	}
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", err
		}
	}
	// All-numeric final label: an IPv4 address in some other spelling (1.2.3.010).
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "", errors.New("the last label is numeric")
	}
	lower := strings.ToLower(name)
	for _, sfx := range specialUse {
		if lower == sfx || strings.HasSuffix(lower, "."+sfx) {
			return "", fmt.Errorf("under .%s, a special-use domain no public CA issues for", sfx)
		}
	}
	return lower, nil
}

// specialUse are the special-use domains (RFC 6761 and IANA's Special-Use Domain
// Names registry) that no public CA issues for: their answers come from the local
// network or another naming system, so an operator's resolver may answer them with
// anything, and the CA refuses them after an order was spent. "test" and "example"
// are left out on purpose: test CAs issue for them, and the tests use them.
var specialUse = []string{
	"local",     // multicast DNS (RFC 6762)
	"onion",     // Tor (RFC 7686)
	"internal",  // private use (ICANN's reservation)
	"localhost", // the host itself (RFC 6761)
	"invalid",   // never resolves (RFC 6761)
	"alt",       // non-DNS naming systems (RFC 9476)
	"home.arpa", // home networks (RFC 8375)
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("an empty label")
	case l == "*":
		return errors.New("a wildcard (valid only as the first label, with --dns01-zone)")
	case len(l) > 63:
		return fmt.Errorf("a label of %d characters, more than 63", len(l))
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			continue
		}
		if c >= 0x80 {
			return fmt.Errorf("non-ASCII characters (use the A-label, xn--...)")
		}
		return fmt.Errorf("character %q is not allowed", c)
	}
	return nil
}
