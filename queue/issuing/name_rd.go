package issuing

import "golang.org/x/net/publicsuffix"

// RegisteredDomain is the registered domain of name by the public suffix list (the
// eTLD+1: shop.example for a.b.shop.example, example.co.uk for www.example.co.uk): what a
// CA's limit per registered domain counts by. A name that is itself a public suffix is
// its own.
func RegisteredDomain(name string) string {
	rd, err := publicsuffix.EffectiveTLDPlusOne(name)
	if err != nil {
		return name
	}
	return rd
}
