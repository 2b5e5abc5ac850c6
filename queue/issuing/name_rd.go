package issuing

import "golang.org/x/net/publicsuffix"

// RegisteredDomain is name's registered domain by the public suffix list (eTLD+1),
// by which a CA's per-registered-domain limit counts; a public suffix is its own.
func RegisteredDomain(name string) string {
	rd, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		return name
	}
	return rd
}
