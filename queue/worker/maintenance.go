package worker

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/certworker/certworker/listener"
	"github.com/certworker/certworker/queue"
	"github.com/certworker/certworker/queue/issuing"
)

// maintenanceLoop runs the steps that find work no wake-up announces (abandoned
// claims, renewals due) on its own timer, beside the loop. Only the holder of the
// maintenance duty (queue.TakeDuty) runs them; a run this instance asked for itself
// (wantMaintenance) marks renewals even without it. Each run is logged at Debug
// ("maintenance ran") with the aim its timer fired for (nextMaint) and the renewals
// it marked.
func (w *Worker) maintenanceLoop(ctx context.Context) {
	start := time.Now()
	aim := nextMaint{due: start, readAt: start, readDone: start, why: "start"}
	t := time.NewTimer(0)
	defer t.Stop()
	defer w.releaseMaintenanceDuty(ctx)
	wanted := false
	for {
		select {
		case <-ctx.Done():
			return
		case want := <-w.maintAt:
			if want.due.Before(aim.due) {
				aim, wanted = want, true
				t.Reset(aim.timer())
			}
			continue
		case <-t.C:
		}
		started := time.Now()
		renewals := 0
		var next nextMaint
		held, left := w.maintenanceDuty(ctx)
		if held {
			renewals = w.maintain(ctx)
			next = w.nextMaintenance(ctx)
		} else {
			w.log.Debug("maintenance left to the instance holding the duty", zap.Duration("duty_left", left))
			if wanted {
				if renewals = w.markRenewals(ctx); renewals > 0 {
					w.kickPass()
				}
			}
			next = aimIn(min(left, w.cfg.PollInterval), started, time.Now(), "duty held elsewhere")
		}
		w.log.Debug("maintenance ran", zap.Time("due", aim.due), zap.Time("read_at", aim.readAt),
			zap.Time("read_done", aim.readDone), zap.String("why", aim.why), zap.Time("started", started),
			zap.Bool("duty", held), zap.Int("renewals", renewals))
		aim, wanted = next, false
		t.Reset(aim.timer())
	}
}

// nextMaint is a maintenance run wanted, and how the worker learned when: a delay
// the database computed (renew_at - clock_timestamp() on the server, say), asked for
// at readAt and answered by readDone. due is readDone plus that delay, without
// timerSlack: the timer fires timerSlack after due.
//
// The server read its clock at some instant between readAt and readDone, so for the
// renewal time R the delay was for, R <= due <= max(R, readAt) + (readDone - readAt)
// (a time already past is a delay of 0: due is readDone), however slow the machine
// and however late the timer then fires. A retried read only widens the bracket,
// which stays true. The bracket is logged with the run ("maintenance ran"), so a
// test holds the worker to where it aimed, not to a stopwatch.
type nextMaint struct {
	due, readAt, readDone time.Time
	// why names what set the aim: "after a run: renewal" (the next renewal time
	// read after a run; also "reclaim", "poll", "duty lease", "unreadable"),
	// "certificate stored", "renewal information", "duty held elsewhere", "start".
	why string
}

// aimIn is the aim d after readDone, read between readAt and readDone.
func aimIn(d time.Duration, readAt, readDone time.Time, why string) nextMaint {
	return nextMaint{due: readDone.Add(max(d, 0)), readAt: readAt, readDone: readDone, why: why}
}

// timer is how long from now the timer waits for a: until due, and timerSlack.
func (a nextMaint) timer() time.Duration { return max(time.Until(a.due)+timerSlack, 0) }

// dutyTTL is the maintenance duty's lease, a claim's lease: a dead holder's duty
// runs out with its claims.
func (w *Worker) dutyTTL() time.Duration { return w.cfg.Queue.Lease }

// maintenanceDuty takes or renews the maintenance duty: held, or how long until the
// holder's lease runs out. An unreadable duty counts as held.
func (w *Worker) maintenanceDuty(ctx context.Context) (held bool, left time.Duration) {
	sctx, cancel := w.step(ctx, false)
	defer cancel()
	held, left, err := w.q.TakeDuty(sctx, queue.DutyMaintenance, w.owner, w.dutyTTL())
	if err != nil {
		w.health.failed(err)
		w.logDBError("take the maintenance duty", err)
		return true, 0
	}
	w.health.ok()
	return held, left
}

func (w *Worker) releaseMaintenanceDuty(ctx context.Context) {
	rctx, cancel := w.step(ctx, true)
	defer cancel()
	if err := w.q.ReleaseDuty(rctx, queue.DutyMaintenance, w.owner); err != nil {
		w.logDBError("release the maintenance duty", err)
	}
}

func (w *Worker) kickPass() {
	select {
	case w.kick <- listener.SourceTimer:
	default:
	}
}

// wantMaintenance asks for a maintenance run at a, unless one is due sooner.
func (w *Worker) wantMaintenance(a nextMaint) {
	for {
		select {
		case w.maintAt <- a:
			return
		default:
		}
		select {
		case old := <-w.maintAt:
			if old.due.Before(a.due) {
				a = old
			}
		default:
		}
	}
}

// nextMaintenance is when the next maintenance run is due, as the database computed
// it after a run, capped by the poll and by half the duty's lease.
func (w *Worker) nextMaintenance(ctx context.Context) nextMaint {
	sctx, cancel := w.step(ctx, false)
	defer cancel()
	readAt := time.Now()
	next, err := w.q.NextMaintenance(sctx)
	readDone := time.Now()
	if err != nil {
		w.health.failed(err)
		w.logDBError("compute next maintenance time", err)
		return aimIn(min(w.cfg.Queue.Lease/3, w.cfg.PollInterval), readAt, readDone, "after a run: unreadable")
	}
	w.health.ok()
	d, why := w.cfg.PollInterval, "poll"
	if next.Renewals != nil && *next.Renewals < d {
		d, why = *next.Renewals, "renewal"
	}
	if next.Reclaim != nil {
		if r := max(*next.Reclaim, w.cfg.Queue.Lease-w.health.upFor()); r < d {
			d, why = r, "reclaim"
		}
	}
	if half := w.dutyTTL() / 2; half < d {
		// The run renews the duty's lease.
		d, why = half, "duty lease"
	}
	return aimIn(d, readAt, readDone, "after a run: "+why)
}

// maintain runs the maintenance steps once, starts a pass when one of them queued a
// domain, and returns how many renewals it marked (markRenewals).
func (w *Worker) maintain(ctx context.Context) (renewals int) {
	w.housekeeping(ctx)
	w.settleStaleLedger(ctx)
	w.recordWithdrawals(ctx)
	reclaimed := w.reclaim(ctx)
	renewals = w.markRenewals(ctx)
	if reclaimed+renewals > 0 {
		w.kickPass()
	}
	return renewals
}

// recordWithdrawals records the withdrawn event of the domains the proxy took out of
// certworker's hands since the last run (queue.Queue.RecordWithdrawals).
func (w *Worker) recordWithdrawals(ctx context.Context) {
	rctx, cancel := w.step(ctx, false)
	defer cancel()
	n, err := w.q.RecordWithdrawals(rctx)
	if err != nil {
		w.logDBError("record withdrawn domains", err)
	}
	if n > 0 {
		w.log.Debug("withdrawn domains recorded in their history", zap.Int64("domains", n))
	}
}

// reclaim requeues domains whose claim was abandoned by an instance that died, with
// the attempt counted, once the database has answered this instance for a full lease
// (dbHealth). Safety does not rest on this wait; it keeps a shared outage from being
// charged: live instances hand their stopped orders back uncharged first.
func (w *Worker) reclaim(ctx context.Context) int {
	if up := w.health.upFor(); up < w.cfg.Queue.Lease {
		w.log.Debug("reclaim waits for the database to have been up a full lease", zap.Duration("up_for", up))
		return 0
	}
	rctx, cancel := w.step(ctx, false)
	defer cancel()
	reclaimed, err := w.q.ReclaimAbandoned(rctx)
	if err != nil {
		// What the batches before the failure reclaimed is logged all the same.
		w.health.failed(err)
		w.logDBError("reclaim abandoned", err)
	} else {
		w.health.ok()
	}
	for _, r := range reclaimed {
		w.log.Warn("domain was left mid-issuance by an instance that stopped; requeued",
			issuing.LogDomain(r.Domain, r.ID, r.TenantID),
			zap.String("error", "issuance was interrupted before it finished"),
			zap.Int("attempt", r.Attempts), zap.Bool("gave_up", r.GaveUp))
	}
	return len(reclaimed)
}

// markRenewals queues certificates due for renewal and promotes urgent renewals; a
// certificate row it cannot use is logged once and its domain ordered afresh.
func (w *Worker) markRenewals(ctx context.Context) int {
	rctx, cancel := w.step(ctx, false)
	defer cancel()
	pass, err := w.q.MarkRenewals(rctx)
	if err != nil {
		w.health.failed(err)
		w.logDBError("mark renewals", err)
	} else {
		w.health.ok()
	}
	w.badRows("certificate row unusable; the domain is ordered afresh", pass.Bad)
	if pass.Marked > 0 {
		w.log.Info("certificates due for renewal", zap.Int64("renewals", pass.Marked))
	}
	pctx, cancel := w.step(ctx, false)
	defer cancel()
	promoted, err := w.q.PromoteUrgentRenewals(pctx)
	if err != nil {
		w.logDBError("promote urgent renewals", err)
	} else if promoted > 0 {
		w.log.Info("renewals became urgent; served before first issuances", zap.Int64("renewals", promoted))
	}
	return int(pass.Marked + promoted)
}

// badRows logs and counts rows a step could not use, each once.
func (w *Worker) badRows(msg string, bad []issuing.BadRow) {
	for _, b := range bad {
		w.m.badRow()
		w.log.Warn(msg, issuing.LogDomain(b.Domain, b.ID, b.TenantID), zap.String("error", b.Reason))
	}
}

// staleLedgerMargin is what an order may take beyond --order-timeout before the
// ledger stops waiting for its end.
func (w *Worker) staleLedgerMargin() time.Duration { return w.cfg.Queue.Lease }

// settleStaleLedger records as unknown the ledger's orders pending past the longest
// an order can live (queue.SettleStaleLedger).
func (w *Worker) settleStaleLedger(ctx context.Context) {
	for _, at := range w.cas() {
		if !at.limits.Any() {
			continue
		}
		sctx, cancel := w.step(ctx, false)
		n, err := w.q.SettleStaleLedger(sctx, at.directory, w.cfg.OrderTimeout+w.staleLedgerMargin())
		cancel()
		if err != nil {
			w.logDBError("settle stale ledger rows", err)
			continue
		}
		if n > 0 {
			w.log.Warn("ledger rows of orders that ended unrecorded; counted as the CA may have counted them",
				zap.Int64("orders", n), zap.Duration("older_than", w.cfg.OrderTimeout+w.staleLedgerMargin()),
				zap.String("ca", at.label))
		}
	}
}

// housekeepingEvery is how often the steps that read whole tables run: none is
// urgent.
const housekeepingEvery = 10 * time.Minute

// housekeeping applies the case twins' rule, fails domains stuck at the attempt
// limit, and prunes, once every housekeepingEvery.
func (w *Worker) housekeeping(ctx context.Context) {
	if time.Since(w.lastHousekeeping) < housekeepingEvery {
		return
	}
	w.lastHousekeeping = time.Now()
	hctx, cancel := context.WithTimeout(ctx, w.cfg.PollInterval)
	defer cancel()
	twins, back, err := w.q.MarkCaseDuplicates(hctx)
	if err != nil {
		w.logDBError("mark domains that differ only in case", err)
	}
	w.badRows("another domain keeps this name in another case; marked failed", twins)
	for _, r := range back {
		w.log.Info("a domain failed as a case twin keeps its name now; back in the queue",
			issuing.LogDomain(r.Domain, r.ID, r.TenantID))
	}
	exhausted, err := w.q.FailExhausted(hctx)
	if err != nil {
		w.logDBError("fail domains at the attempt limit", err)
	}
	w.badRows("domain at or above --max-attempts, which no claim takes; marked failed", exhausted)
	w.requeueProfileChanges(hctx)
	var keep []queue.LedgerWindow
	for _, at := range w.cas() {
		keep = append(keep, queue.LedgerWindow{Directory: at.directory, Window: at.limits.Longest()})
	}
	pruned, err := w.q.Prune(hctx, keep...)
	if err != nil {
		w.logDBError("prune", err)
		return
	}
	if pruned != (queue.PruneResult{}) {
		w.log.Info("pruned", zap.Int64("http01_tokens", pruned.Tokens), zap.Int64("pauses", pruned.Pauses),
			zap.Int64("ledger_rows", pruned.Ledger), zap.Int64("tenant_counters", pruned.Tenants),
			zap.Int64("certificates_of_deleted_domains", pruned.Certificates),
			zap.Int64("issued_names_of_deleted_domains", pruned.IssuedNames),
			zap.Int64("orders_of_deleted_domains", pruned.Orders),
			zap.Int64("domain_events", pruned.Events))
	}
}

// requeueProfileChanges queues the replacements certworker_set_profile did not.
func (w *Worker) requeueProfileChanges(ctx context.Context) {
	changed, err := w.q.RequeueProfileChanges(ctx)
	if err != nil {
		w.logDBError("requeue certificates of a changed profile", err)
		return
	}
	if changed > 0 {
		w.log.Info("certificates to replace: their domain's profile changed", zap.Int64("domains", changed))
		select {
		case w.kick <- listener.SourceTimer:
		default:
		}
	}
}
