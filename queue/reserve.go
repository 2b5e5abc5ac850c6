package queue

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/jackc/pgx/v5"
)

// The tenant reserve (--limit-tenant-reserve): an account-wide limit
// L (orders per account, at each CA) is shared between tenants. With
// R = ⌈L × reserve⌉, the last R orders of a window go only to tenants with fewer than
// R orders of their own in it, so a tenant alone is capped at L − R: one tenant's
// bulk import, or its names failing validation over and over, cannot use up the
// account while another tenant's newcomer waits for the whole window.
//
// It applies where orders per account applies: orders the CA exempts from it
// (renewals, ARI renewals) are neither held back nor counted. The ledger records the
// tenant with each order (certworker_ledger.tenant_id), so that an order counts for
// its tenant for the whole window, whatever the tenant deletes meanwhile: joining
// through the domain would lose a deleted row, and a tenant could escape the cap by
// deleting and re-adding its domains.
//
// A tenant held back by it is paused like any limit of the ledger: scope 'tenant',
// key the tenant's id, source 'ledger', in that CA's directory. Both claims,
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

// tenantCountsSQL counts, per tenant of $3, the orders of the CA at $1 that count
// against orders per account in its window ($2 seconds): as ledgerCounts' 'account'.
const tenantCountsSQL = `
SELECT tenant_id::text, count(*), min(at) + make_interval(secs => $2) FROM certworker_ledger
 WHERE $2 > 0 AND directory = $1 AND tenant_id = ANY ($3::uuid[]) AND at > now() - make_interval(secs => $2)
   AND outcome <> 'not_sent' AND NOT renewal
 GROUP BY tenant_id`

// reserveCounts adds to counts, under the key ("tenant", id), what each tenant of as
// has ordered in the account's window, when the reserve is on.
func reserveCounts(ctx context.Context, tx pgx.Tx, directory string, l issuing.Limits, as []Admission, counts map[ledgerKey]ledgerCount) error {
	if tenantReserve(l.OrdersPerAccount, l.TenantReserve) == 0 {
		return nil
	}
	var tenants []string
	for _, a := range as {
		if a.Claim.TenantID != "" {
			tenants = append(tenants, a.Claim.TenantID)
		}
	}
	rows, err := tx.Query(ctx, tenantCountsSQL, directory, seconds(l.OrdersPerAccount.ActiveWindow()), tenants)
	if err != nil {
		return fmt.Errorf("count orders per tenant: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var tenant string
		var c ledgerCount
		if err := rows.Scan(&tenant, &c.n, &c.frees); err != nil {
			return fmt.Errorf("count orders per tenant: %w", err)
		}
		counts[ledgerKey{issuing.ScopeTenant, tenant}] = c
	}
	return rows.Err()
}

// reserveHolds returns why a's tenant must leave the rest of the account's window to
// the others, or "": a is not exempt from orders per account, the account's orders
// have reached L − R, and the tenant has R of its own. The pause frees when the
// account's oldest order leaves the window, the earliest moment either count can
// fall, when the claim asks again.
func (d *ledgerDecision) reserveHolds(a Admission) string {
	l := d.limits.OrdersPerAccount
	r := tenantReserve(l, d.limits.TenantReserve)
	if r == 0 || a.Renewal || a.exempt || a.Claim.TenantID == "" {
		return ""
	}
	account := d.counts[ledgerKey{"account", d.directory}].n
	own := d.counts[ledgerKey{issuing.ScopeTenant, a.Claim.TenantID}].n
	if account < l.Count-r || own < r {
		return ""
	}
	why := fmt.Sprintf("ledger: %d of the account's %d orders in %s are taken, %d by this tenant; the last %d go to "+
		"tenants with fewer than %d (--limit-tenant-reserve %s of --limit-orders-per-account %s)",
		account, l.Count, l.Window, own, r, r, strconv.FormatFloat(d.limits.TenantReserve*100, 'f', -1, 64)+"%", l)
	k := ledgerKey{issuing.ScopeTenant, a.Claim.TenantID}
	if c, f := d.counts[k], d.counts[ledgerKey{"account", d.directory}].frees; f != nil && (c.frees == nil || f.Before(*c.frees)) {
		c.frees = f
		d.counts[k] = c
	}
	d.markFull(k, why)
	return why
}

// recordReserve counts an admitted order for its tenant.
func (d *ledgerDecision) recordReserve(a Admission) {
	if a.Renewal || a.Claim.TenantID == "" || tenantReserve(d.limits.OrdersPerAccount, d.limits.TenantReserve) == 0 {
		return
	}
	k := ledgerKey{issuing.ScopeTenant, a.Claim.TenantID}
	c := d.counts[k]
	c.n++
	d.counts[k] = c
}
