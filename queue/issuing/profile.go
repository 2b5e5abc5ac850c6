package issuing

import (
	"fmt"
	"regexp"
	"strings"
)

// ProfilePrefix starts the ssl_error of a domain whose own profile the CA does not
// offer.
const ProfilePrefix = "profile: "

// MaxProfileNameLen bounds a profile name, to fit logs and ssl_error.
const MaxProfileNameLen = 64

// profileName is what certworker_set_profile accepts; the two have to agree.
var profileName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckProfileName reports whether s is a profile name certworker orders under. A
// tenant's ssl_profile is hostile until checked.
func CheckProfileName(s string) error {
	if profileName.MatchString(s) {
		return nil
	}
	return fmt.Errorf("%s is not a profile name (1 to %d ASCII letters, digits, '.', '_' or '-')",
		quoteProfile(s), MaxProfileNameLen)
}

// quoteProfile quotes a possibly hostile profile name for a message, cut short.
func quoteProfile(s string) string {
	if len(s) > MaxProfileNameLen {
		return fmt.Sprintf("%q...", s[:MaxProfileNameLen])
	}
	return fmt.Sprintf("%q", s)
}

// ProfileError: the CA does not offer the order's ACME profile: its directory does
// not list it (nothing sent), or it answered invalidProfile. Nothing was issued.
type ProfileError struct {
	// Profile is the profile the order was to name.
	Profile string
	// Offered are the profiles the CA's directory lists, sorted; nil when not known.
	Offered []string
	// Detail is the CA's problem detail, "" when nothing was sent.
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
