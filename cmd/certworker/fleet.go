package main

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/certworker/certworker/queue"
)

// fleetInterval is how often the holder of the statistics duty reads the fleet
// statistics. At a million domains at rest a read costs the database milliseconds,
// plus the count of every acme domain (about 100 ms on an idle server) once every
// fleetTotalsEvery, so once a minute is a fraction of a percent of a core;
// and an alert that waits for minutes (deploy/alerts.yaml) loses nothing to a minute's
// delay. Scrapes, however often they come, read the last values and cost nothing.
const fleetInterval = time.Minute

// fleetTotalsEvery is how often the holder counts the active and the verified domains
// (queue.FleetTotals), which reads an index of every acme domain: at a million
// domains that was most of the fleet's database time at rest (bench/fleet-at-rest.txt).
// The other figures are read at every read; the SLO's numerator follows expiries at
// once (queue.FleetStatsReusing), and its alert waits 30 minutes, so 10 minutes of
// age in its denominator loses nothing.
const fleetTotalsEvery = 10 * time.Minute

// fleetTimeout bounds one read, so that a database that hangs does not stack them up.
const fleetTimeout = 30 * time.Second

// fleet reads queue.FleetStats on a timer and reports the last values as Prometheus
// metrics: the alerts' inputs (deploy/alerts.yaml). Every series is per fleet, not per
// domain, so there are as many at a million domains as at one. One instance of the
// fleet reads them, the holder of the statistics duty (queue.TakeDuty), which it
// renews at each read; the others report none of the figures, only when they last
// read them, and take the duty over when the holder's lease runs out. Alert rules take
// the max over instances, which is the holder's. It is a prometheus.Collector.
//
// Start and Stop follow the services' shape: Stop is safe before Start and twice.
type fleet struct {
	q         *queue.Queue
	directory string
	// holder is this instance's name for the statistics duty.
	holder   string
	interval time.Duration
	log      *zap.Logger

	mu       sync.Mutex
	stats    *queue.FleetStats // guarded by mu; nil until the first read succeeds
	lastOK   time.Time         // guarded by mu
	took     time.Duration     // guarded by mu: the last read's duration
	failures float64           // guarded by mu: reads that failed, ever

	runMu  sync.Mutex
	cancel context.CancelFunc // guarded by runMu
	done   chan struct{}      // guarded by runMu
}

// newFleet returns a collector of the fleet statistics for the CA at directory (the
// issuer's --acme-directory), read every interval once started by whichever instance
// holds the duty; holder names this one.
func newFleet(q *queue.Queue, directory, holder string, interval time.Duration, log *zap.Logger) *fleet {
	return &fleet{q: q, directory: directory, holder: holder, interval: interval, log: log.Named("fleet")}
}

// dutyTTL is the statistics duty's lease: three reads, so that one read that fails
// or runs long does not hand the duty over, and a holder that died is replaced well
// before the alert on stale statistics (10 minutes) fires.
func (f *fleet) dutyTTL() time.Duration { return 3 * f.interval }

// Start reads the statistics at once and then every interval, in a goroutine, until
// Stop or the end of ctx. A second Start while running does nothing.
func (f *fleet) Start(ctx context.Context) {
	f.runMu.Lock()
	defer f.runMu.Unlock()
	if f.cancel != nil {
		return
	}
	ctx, f.cancel = context.WithCancel(ctx)
	f.done = make(chan struct{})
	go f.loop(ctx, f.done)
}

// Stop ends the reads and waits for the one under way.
func (f *fleet) Stop() {
	f.runMu.Lock()
	defer f.runMu.Unlock()
	if f.cancel == nil {
		return
	}
	f.cancel()
	<-f.done
	f.cancel, f.done = nil, nil
}

func (f *fleet) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	defer f.release(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(f.refresh(ctx))
	}
}

// refresh reads the statistics once and keeps them, or keeps the last ones and counts
// the failure (the scrape then shows how old they are), and returns when to look
// again. Another instance holding the duty reads them instead: this one drops the
// figures it read before (they would only grow stale beside the holder's) and looks
// again when the holder's lease runs out, after interval at the latest. A duty that
// cannot be read counts as held: better two instances reading than none.
func (f *fleet) refresh(ctx context.Context) time.Duration {
	rctx, cancel := context.WithTimeout(ctx, fleetTimeout)
	defer cancel()
	held, left, err := f.q.TakeDuty(rctx, queue.DutyFleetStats+f.directory, f.holder, f.dutyTTL())
	if err == nil && !held {
		f.mu.Lock()
		f.stats = nil
		f.mu.Unlock()
		return min(left+time.Second, f.interval)
	}
	f.read(ctx, rctx)
	return f.interval
}

// release hands the statistics duty on when the reads stop (ctx ended), so that
// another instance takes it at its next look instead of when the lease runs out.
func (f *fleet) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fleetTimeout)
	defer cancel()
	if err := f.q.ReleaseDuty(rctx, queue.DutyFleetStats+f.directory, f.holder); err != nil {
		f.log.Warn("fleet statistics duty not released; another instance takes it when its lease runs out", zap.Error(err))
	}
}

// read reads the statistics once, within rctx, and keeps them, or keeps the last ones
// and counts the failure (not when ctx, the loop's, ended).
func (f *fleet) read(ctx, rctx context.Context) {
	f.mu.Lock()
	var last *queue.FleetTotals
	if f.stats != nil {
		t := f.stats.Totals
		last = &t
	}
	f.mu.Unlock()
	start := time.Now()
	s, err := f.q.FleetStatsReusing(rctx, f.directory, last, fleetTotalsEvery)
	took := time.Since(start)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.took = took
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return
		}
		f.failures++
		f.log.Warn("fleet statistics not read; the metrics keep the last values", zap.Error(err), zap.Duration("took", took))
		return
	}
	f.stats, f.lastOK = &s, time.Now()
	f.log.Debug("fleet statistics read", zap.Duration("took", took))
}

var (
	fleetQueueDesc = prometheus.NewDesc("certworker_queue_domains",
		"ACME domains by ssl_status, from the last fleet statistics read.", []string{"status"}, nil)
	fleetExpiringDesc = prometheus.NewDesc("certworker_certificates_expiring_unrenewed",
		"Verified ACME domains whose certificate expires within the window and that nothing is renewing: failed, retrying after a failure, or active an hour past their renewal time.",
		[]string{"within"}, nil)
	fleetOldestDesc = prometheus.NewDesc("certworker_certificates_oldest_expiry_timestamp_seconds",
		"The earliest expiry among the valid certificates of verified ACME domains (absent when there is none).", nil, nil)
	fleetVerifiedDesc = prometheus.NewDesc("certworker_domains_verified",
		"Verified ACME domains: the SLO's denominator.", nil, nil)
	fleetValidDesc = prometheus.NewDesc("certworker_domains_valid_certificate",
		"Verified ACME domains holding a certificate that has not expired: the SLO's numerator.", nil, nil)
	fleetSLODesc = prometheus.NewDesc("certworker_certificate_slo_ratio",
		"certworker_domains_valid_certificate / certworker_domains_verified (1 with no verified domain).", nil, nil)
	fleetPendingDesc = prometheus.NewDesc("certworker_domains_pending_over_1h",
		"Queued domains (verified, acme, pending) that entered the queue more than an hour ago.", nil, nil)
	fleetPausedDesc = prometheus.NewDesc("certworker_paused_domains",
		"Queued domains held back by a pause in force, by scope (ca, registered_domain, domain).", []string{"scope"}, nil)
	fleetCAPausedDesc = prometheus.NewDesc("certworker_ca_paused",
		"1 while ordering from this instance's ACME directory is paused for every instance, else 0.", nil, nil)
	fleetLedgerDesc = prometheus.NewDesc("certworker_ledger_account_orders",
		"Orders the ledger counted against the account-wide limit in its last DURATION (absent while the limit is off).", nil, nil)
	fleetLedgerLimitDesc = prometheus.NewDesc("certworker_ledger_account_orders_limit",
		"The account-wide order limit (absent while it is off).", nil, nil)
	fleetReplaceDesc = prometheus.NewDesc("certworker_certificates_replace_now",
		"Valid certificates of verified ACME domains whose renewal window (ARI) has started and that are not yet replaced.", nil, nil)
	fleetReplaceExpiryDesc = prometheus.NewDesc("certworker_certificates_replace_now_earliest_expiry_timestamp_seconds",
		"The earliest expiry among the certificates to replace now (absent when there is none).", nil, nil)
	fleetReplacedDesc = prometheus.NewDesc("certworker_certificates_replaced_recently",
		"Renewals issued by this instance's ACME directory in the last 15 minutes, from the ledger: the pace of replacement.", nil, nil)
	fleetReplaceDoneDesc = prometheus.NewDesc("certworker_certificates_replace_now_done_by_timestamp_seconds",
		"When the certificates to replace now are all replaced at the pace of the last 15 minutes (+Inf: none replaced in them).", nil, nil)
	fleetTotalsAtDesc = prometheus.NewDesc("certworker_fleet_stats_totals_timestamp_seconds",
		"When certworker_queue_domains{status=\"active\"} and certworker_domains_verified were counted (every 10 minutes; the other figures at every read).", nil, nil)
	fleetLastOKDesc = prometheus.NewDesc("certworker_fleet_stats_last_success_timestamp_seconds",
		"When the fleet statistics were last read (0: never).", nil, nil)
	fleetTookDesc = prometheus.NewDesc("certworker_fleet_stats_duration_seconds",
		"How long the last read of the fleet statistics took.", nil, nil)
	fleetFailuresDesc = prometheus.NewDesc("certworker_fleet_stats_failures_total",
		"Reads of the fleet statistics that failed.", nil, nil)
)

// Describe implements prometheus.Collector.
func (f *fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		fleetQueueDesc, fleetExpiringDesc, fleetOldestDesc, fleetVerifiedDesc, fleetValidDesc, fleetSLODesc,
		fleetPendingDesc, fleetPausedDesc, fleetCAPausedDesc, fleetLedgerDesc, fleetLedgerLimitDesc,
		fleetReplaceDesc, fleetReplaceExpiryDesc, fleetReplacedDesc, fleetReplaceDoneDesc,
		fleetTotalsAtDesc, fleetLastOKDesc, fleetTookDesc, fleetFailuresDesc,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last values read, never a query.
func (f *fleet) Collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	s, lastOK, took, failures := f.stats, f.lastOK, f.took, f.failures
	f.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	var last float64
	if !lastOK.IsZero() {
		last = float64(lastOK.UnixNano()) / 1e9
	}
	gauge(fleetLastOKDesc, last)
	gauge(fleetTookDesc, took.Seconds())
	ch <- prometheus.MustNewConstMetric(fleetFailuresDesc, prometheus.CounterValue, failures)
	if s == nil {
		return
	}
	for status, n := range s.Domains {
		gauge(fleetQueueDesc, float64(n), status)
	}
	for i, w := range queue.ExpiryWindows {
		if i < len(s.ExpiringUnrenewed) {
			gauge(fleetExpiringDesc, float64(s.ExpiringUnrenewed[i]), days(w))
		}
	}
	if s.NextExpiry != nil {
		gauge(fleetOldestDesc, float64(s.NextExpiry.UnixNano())/1e9)
	}
	gauge(fleetTotalsAtDesc, float64(s.Totals.At.UnixNano())/1e9)
	gauge(fleetVerifiedDesc, float64(s.Verified))
	gauge(fleetValidDesc, float64(s.Valid))
	ratio := 1.0
	if s.Verified > 0 {
		ratio = float64(s.Valid) / float64(s.Verified)
	}
	gauge(fleetSLODesc, ratio)
	gauge(fleetPendingDesc, float64(s.PendingOverHour))
	for scope, n := range s.Paused {
		gauge(fleetPausedDesc, float64(n), scope)
	}
	caPaused := 0.0
	if s.CAPausedUntil != nil {
		caPaused = 1
	}
	gauge(fleetCAPausedDesc, caPaused)
	if s.LedgerLimit != nil && s.LedgerOrders != nil {
		gauge(fleetLedgerDesc, float64(*s.LedgerOrders))
		gauge(fleetLedgerLimitDesc, float64(*s.LedgerLimit))
	}
	gauge(fleetReplaceDesc, float64(s.Replace.Due))
	gauge(fleetReplacedDesc, float64(s.Replace.Replaced))
	gauge(fleetReplaceDoneDesc, s.Replace.DoneBySeconds())
	if s.Replace.EarliestExpiry != nil {
		gauge(fleetReplaceExpiryDesc, float64(s.Replace.EarliestExpiry.UnixNano())/1e9)
	}
}

// days labels a window in whole days: "7d".
func days(d time.Duration) string { return strconv.Itoa(int(d/(24*time.Hour))) + "d" }
