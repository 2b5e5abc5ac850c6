package issuing

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The wake modes (`certworker run --wake`, certworker_settings.wake).
const (
	// WakeNotify: the trigger notifies and the worker listens.
	WakeNotify = "notify"
	// WakeLogical: the trigger does not notify; the worker reads a logical
	// replication stream.
	WakeLogical = "logical"
)

// Limit is one ledger limit, a token bucket as the CA counts it (GCRA): a burst of
// Count, refilled one token every Window/Count (Interval). The zero Limit is off.
type Limit struct {
	Count  int
	Window time.Duration
}

// Off reports whether the limit is off.
func (l Limit) Off() bool { return l.Count <= 0 || l.Window <= 0 }

// Interval is how often the bucket gains a token: Window/Count.
func (l Limit) Interval() time.Duration {
	if l.Off() {
		return 0
	}
	return l.Window / time.Duration(l.Count)
}

// DefaultConsecutiveFailures is --limit-consecutive-failures: Let's Encrypt pauses a
// name for the account after 1,152 failed authorizations in a row, and gives one back
// a day.
const DefaultConsecutiveFailures = 1152

// ConsecutiveFailuresRefill is how often the CA forgives one failed authorization in
// a row.
const ConsecutiveFailuresRefill = 24 * time.Hour

// ParseConsecutiveFailures reads --limit-consecutive-failures: COUNT, or off. Its
// bucket refills one a day (ConsecutiveFailuresRefill). A count below 2 would stop a
// name before its first order (the name stops at COUNT - 1).
func ParseConsecutiveFailures(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return Limit{}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 2 {
		return Limit{}, fmt.Errorf("%q is not a whole number of at least 2, or off", s)
	}
	return ConsecutiveFailures(n), nil
}

// ConsecutiveFailures is the limit of n failed authorizations in a row, refilled one
// a day.
func ConsecutiveFailures(n int) Limit {
	return Limit{Count: n, Window: time.Duration(n) * ConsecutiveFailuresRefill}
}

// String is the flag's form: COUNT/DURATION, or off.
func (l Limit) String() string {
	if l.Off() {
		return "off"
	}
	return strconv.Itoa(l.Count) + "/" + l.Window.String()
}

// ParseLimit reads a --limit-* value: COUNT/DURATION (a Go duration), or off.
func ParseLimit(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return Limit{}, nil
	}
	count, window, ok := strings.Cut(s, "/")
	if !ok {
		return Limit{}, fmt.Errorf("%q is not COUNT/DURATION or off", s)
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return Limit{}, fmt.Errorf("%q: the count must be a whole number of at least 1", s)
	}
	d, err := time.ParseDuration(window)
	if err != nil || d <= 0 {
		return Limit{}, fmt.Errorf("%q: the window must be a positive Go duration such as 3h", s)
	}
	return Limit{Count: n, Window: d}, nil
}

// Limits are the ledger's limits, mirrors of the CA's published ones (the --limit-* flags, docs/cas.md).
type Limits struct {
	OrdersPerAccount         Limit
	CertsPerRegisteredDomain Limit
	CertsPerExactSet         Limit
	FailedAuthzPerName       Limit
	// ConsecutiveFailures is --limit-consecutive-failures: failed authorizations of
	// one name in a row, a bucket that refills one a day and that a success fills.
	ConsecutiveFailures Limit
	// TenantReserve is --limit-tenant-reserve (reserve.go); 0 is off.
	TenantReserve float64
}

// Any reports whether any limit is on.
func (l Limits) Any() bool {
	return !l.OrdersPerAccount.Off() || !l.CertsPerRegisteredDomain.Off() ||
		!l.CertsPerExactSet.Off() || !l.FailedAuthzPerName.Off() || !l.ConsecutiveFailures.Off()
}

// Longest is the longest window of the limits that are on (0 when all are off): how
// long ledger rows are worth keeping. The failures in a row are never read from rows,
// so their window is not counted.
func (l Limits) Longest() time.Duration {
	return max(l.OrdersPerAccount.ActiveWindow(), l.CertsPerRegisteredDomain.ActiveWindow(),
		l.CertsPerExactSet.ActiveWindow(), l.FailedAuthzPerName.ActiveWindow())
}

// ActiveWindow is the window of a limit that is on, 0 when it is off.
func (l Limit) ActiveWindow() time.Duration {
	if l.Off() {
		return 0
	}
	return l.Window
}

// jsonLimit is a Limit as certworker_settings.limits stores it.
type jsonLimit struct {
	Count         int     `json:"count"`
	WindowSeconds float64 `json:"window_seconds"`
}

func (l Limit) toJSON() *jsonLimit {
	if l.Off() {
		return nil
	}
	return &jsonLimit{Count: l.Count, WindowSeconds: l.Window.Seconds()}
}

func (j *jsonLimit) limit() Limit {
	if j == nil {
		return Limit{}
	}
	return Limit{Count: j.Count, Window: time.Duration(j.WindowSeconds * float64(time.Second))}
}

type jsonLimits struct {
	OrdersPerAccount         *jsonLimit `json:"orders_per_account"`
	CertsPerRegisteredDomain *jsonLimit `json:"certs_per_registered_domain"`
	CertsPerExactSet         *jsonLimit `json:"certs_per_exact_set"`
	FailedAuthzPerName       *jsonLimit `json:"failed_authz_per_name"`
	ConsecutiveFailures      *jsonLimit `json:"consecutive_failures,omitempty"`
	TenantReserve            float64    `json:"tenant_reserve,omitempty"`
}

// MarshalJSON is the form certworker_settings.limits stores (off is null).
func (l Limits) MarshalJSON() ([]byte, error) {
	return json.Marshal(jsonLimits{
		l.OrdersPerAccount.toJSON(), l.CertsPerRegisteredDomain.toJSON(),
		l.CertsPerExactSet.toJSON(), l.FailedAuthzPerName.toJSON(), l.ConsecutiveFailures.toJSON(), l.TenantReserve,
	})
}

// UnmarshalJSON reads certworker_settings.limits.
func (l *Limits) UnmarshalJSON(b []byte) error {
	var j jsonLimits
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*l = Limits{j.OrdersPerAccount.limit(), j.CertsPerRegisteredDomain.limit(),
		j.CertsPerExactSet.limit(), j.FailedAuthzPerName.limit(), j.ConsecutiveFailures.limit(), j.TenantReserve}
	return nil
}
