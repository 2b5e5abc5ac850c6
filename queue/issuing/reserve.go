package issuing

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ScopeTenant is a pause of one tenant's orders at a CA: the tenant reserve.
const ScopeTenant = "tenant"

// DefaultTenantReserve is --limit-tenant-reserve: a quarter of the account's orders
// is kept for the other tenants.
const DefaultTenantReserve = 0.25

// MaxTenantReserve bounds --limit-tenant-reserve: above a half, a tenant alone could
// take more than the reserve leaves.
const MaxTenantReserve = 0.5

// ParseTenantReserve reads --limit-tenant-reserve: a percentage ("25%") or a fraction
// ("0.25"), from 0 (off) to 50%.
func ParseTenantReserve(s string) (float64, error) {
	s = strings.TrimSpace(s)
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(s, "%")), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a percentage (such as 25%%) or 0", s)
	}
	if pct {
		v /= 100
	}
	if v < 0 || v > MaxTenantReserve {
		return 0, fmt.Errorf("%q: the reserve must be between 0 (off) and 50%%", s)
	}
	return v, nil
}
