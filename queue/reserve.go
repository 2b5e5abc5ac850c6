package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// The tenant reserve (docs/cas.md, "The tenant reserve"; --limit-tenant-reserve): the
// account-wide bucket (orders per account, at each CA) is shared between tenants.
// With R = ⌈L × reserve⌉ for a bucket of L, a tenant that took R or more of its tokens
// in the last DURATION takes one only while the bucket holds more than R: the last R
// tokens go to the other tenants. A tenant alone takes L − R at once, then one each
// time the bucket refills to R + 1, at the bucket's own pace: one tenant's bulk import,
// or its names failing validation over and over, cannot empty the account while
// another tenant's newcomer waits.
//
// It applies where orders per account applies: orders the CA exempts from it
// (renewals, ARI renewals) are neither held back nor counted. The ledger records the
// tenant with each order (certworker_ledger.tenant_id), so that an order counts for
// its tenant for the whole DURATION, whatever the tenant deletes meanwhile: joining
// through the domain would lose a deleted row, and a tenant could escape the reserve
// by deleting and re-adding its domains. The rows of the last DURATION are never
// pruned (Prune keeps the longest window of the CA's limits).
//
// A tenant held back by it is paused like any limit of the ledger: scope 'tenant',
// key the tenant's id, source 'ledger', in that CA's directory, until the bucket holds
// R + 1 tokens or the tenant's count falls below R, whichever comes first. Both claims,
// ReturnHeld and NextDue read it as they read the other pauses, so its rows wait,
// uncharged, out of line, and are not claimed and handed back on every pass; after
// --acme-fallback-after a second CA may take them, under its own ledger and reserve.

// tenantReserve is R for limit l: ⌈Count × reserve⌉, at most Count − 1 (a limit of 1
// has no reserve: it would leave no order to anyone); 0 when off.
func tenantReserve(l issuing.Limit, reserve float64) int {
	if l.Off() || reserve <= 0 {
		return 0
	}
	r := int(math.Ceil(float64(l.Count)*reserve - 1e-9))
	return min(r, l.Count-1)
}

// tenantCountsSQL counts, per tenant of $3, the orders of the CA at $1 that took a
// token of the account's bucket in its last DURATION ($2 seconds), and when that count
// falls below R ($4): when its (count − R + 1)th oldest leaves the DURATION.
const tenantCountsSQL = `
SELECT tenant_id::text, count(*),
       (array_agg(at ORDER BY at))[GREATEST(count(*) - $4 + 1, 1)] + make_interval(secs => $2)
FROM certworker_ledger
 WHERE $2 > 0 AND directory = $1 AND tenant_id = ANY ($3::uuid[]) AND at > now() - make_interval(secs => $2)
   AND outcome <> 'not_sent' AND NOT renewal
 GROUP BY tenant_id`

// tenantUse is what one tenant took of the account's bucket in its last DURATION:
// n tokens, the count falling below R at below.
type tenantUse struct {
	n     int
	below time.Time
}

// reserveCounts reads what each tenant of as took of the account's bucket in its
// last DURATION, when the reserve is on.
func reserveCounts(ctx context.Context, tx pgx.Tx, directory string, l issuing.Limits, as []Admission) (map[string]tenantUse, error) {
	out := map[string]tenantUse{}
	r := tenantReserve(l.OrdersPerAccount, l.TenantReserve)
	if r == 0 {
		return out, nil
	}
	var tenants []string
	for _, a := range as {
		if a.Claim.TenantID != "" {
			tenants = append(tenants, a.Claim.TenantID)
		}
	}
	rows, err := tx.Query(ctx, tenantCountsSQL, directory, seconds(l.OrdersPerAccount.ActiveWindow()), tenants, r)
	if err != nil {
		return nil, fmt.Errorf("count orders per tenant: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var tenant string
		var u tenantUse
		if err := rows.Scan(&tenant, &u.n, &u.below); err != nil {
			return nil, fmt.Errorf("count orders per tenant: %w", err)
		}
		out[tenant] = u
	}
	return out, rows.Err()
}

// reserveHolds returns why a's tenant must leave the account's last R tokens to the
// others, or "": a takes a token of the account's bucket, the tenant took R or more
// in the last DURATION, and the bucket holds R or fewer.
func (d *ledgerDecision) reserveHolds(a Admission) string {
	l := d.limits.OrdersPerAccount
	r := tenantReserve(l, d.limits.TenantReserve)
	if r == 0 || a.Renewal || a.exempt || a.Claim.TenantID == "" {
		return ""
	}
	account := ledgerKey{bucketAccount, d.directory}
	left, own := d.buckets.tokens(account, l), d.tenants[a.Claim.TenantID]
	if own.n < r || left > r {
		return ""
	}
	why := fmt.Sprintf("ledger: the account's bucket holds %d of its %d orders, and this tenant took %d of them in %s; "+
		"the last %d go to tenants with fewer than %d (--limit-tenant-reserve %s of %s)",
		left, l.Count, own.n, l.Window, r, r, strconv.FormatFloat(d.limits.TenantReserve*100, 'f', -1, 64)+"%",
		describe("--limit-orders-per-account", l))
	until := d.buckets.holdsAt(account, l, r+1)
	if !own.below.IsZero() && own.below.Before(until) {
		until = own.below
	}
	d.markFull(ledgerKey{issuing.ScopeTenant, a.Claim.TenantID}, until, why)
	return why
}

// recordReserve counts an admitted order for its tenant.
func (d *ledgerDecision) recordReserve(a Admission) {
	if a.Renewal || a.Claim.TenantID == "" || tenantReserve(d.limits.OrdersPerAccount, d.limits.TenantReserve) == 0 {
		return
	}
	u := d.tenants[a.Claim.TenantID]
	u.n++
	d.tenants[a.Claim.TenantID] = u
}
