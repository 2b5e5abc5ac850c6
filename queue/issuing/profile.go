package issuing

import (
	"fmt"
	"regexp"
	"strings"
)

// ProfilePrefix starts the ssl_error of a domain whose own profile the CA does not
// offer.
const ProfilePrefix = "profile: "

// MaxProfileNameLen bounds a profile name. Let's Encrypt's are a dozen characters at
// most; the bound keeps a tenant's value fit for logs and ssl_error.
const MaxProfileNameLen = 64

// profileName is what certworker_set_profile accepts (migration 00014), and the two
// have to agree: ASCII letters, digits, '.', '_' and '-', starting with a letter or
// digit.
var profileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckProfileName reports whether s is a profile name certworker orders under. A
// tenant's ssl_profile is hostile until checked: it goes into orders, logs and
// ssl_error.
func CheckProfileName(s string) error {
	if profileName.MatchString(s) {
		return nil
	}
	return fmt.Errorf("%s is not a profile name (1 to %d ASCII letters, digits, '.', '_' or '-')",
		quoteProfile(s), MaxProfileNameLen)
}

// quoteProfile quotes a profile name for a message, cut to a length fit for one: the
// value may be a tenant's, and not a name at all.
func quoteProfile(s string) string {
	if len(s) > MaxProfileNameLen {
		return fmt.Sprintf("%q...", s[:MaxProfileNameLen])
	}
	return fmt.Sprintf("%q", s)
}

// ProfileError: the CA does not offer the ACME profile an order was to name. Either
// its directory's meta.profiles does not list it, and nothing was sent, or it
// answered the new order with invalidProfile. Nothing was issued.
type ProfileError struct {
	// Profile is the profile the order was to name.
	Profile string
	// Offered are the profiles the CA's directory lists, sorted; nil when not known.
	Offered []string
	// Detail is the CA's problem detail when it refused the order, "" when the order
	// was not sent.
	Detail string
}

func (e *ProfileError) Error() string {
	var b strings.Builder
	if e.Detail != "" {
		fmt.Fprintf(&b, "the CA refused profile %s (invalidProfile: %s)", quoteProfile(e.Profile), e.Detail)
	} else {
		fmt.Fprintf(&b, "the CA does not offer profile %s", quoteProfile(e.Profile))
	}
	switch {
	case e.Offered == nil:
	case len(e.Offered) == 0:
		b.WriteString("; it offers no profiles")
	default:
		fmt.Fprintf(&b, "; it offers %s", strings.Join(e.Offered, ", "))
	}
	return b.String()
}
