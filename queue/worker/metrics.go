package worker

import (
	"time"

	"github.com/certworker/certworker/queue/issuing"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the loop's Prometheus metrics, created even without a Registerer so
// there is one code path. Label values are bounded sets, never domains.
type metrics struct {
	wakeups       *prometheus.CounterVec
	claims        *prometheus.CounterVec
	outcomes      *prometheus.CounterVec
	durations     *prometheus.HistogramVec
	wakeLatency   prometheus.Histogram
	inflight      prometheus.Gauge
	caUnreachable prometheus.Gauge
	heartbeats    prometheus.Counter
	badRows       prometheus.Counter
	renewalReads  *prometheus.CounterVec
	// The second CA's.
	caOrders            *prometheus.CounterVec
	fallbacks           *prometheus.CounterVec
	secondCAUnreachable prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_wakeups_total",
			Help: "Passes over the queue, by what started them (notify, reconnect, timer, poll, refill).",
		}, []string{"source"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_claims_total",
			Help: "Domains claimed by this instance, by the source of the pass that claimed them.",
		}, []string{"source"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_issuance_total",
			Help: "Finished orders by outcome: issued, failed, gave_up, timeout, invalid, permanent, preflight_failed, waiting_dns (not ordered: waits for its DNS, uncharged), rate_limited, too_many_failures (not ordered: the name failed validation too often in a row), ca_unavailable, key_error, profile_refused, profile_halted, released, lease_deadline (stopped at its lease deadline and handed back), lost, not_acme, unrecorded; released_untracked counts claims handed back whose answer was lost.",
		}, []string{"outcome"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "certworker_issuance_duration_seconds",
			Help:    "Time from claim to recorded result, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"outcome"}),
		wakeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "certworker_wake_latency_seconds",
			Help:    "Time from a domain becoming due (the commit that made it claimable, or its backoff running out) to its claim, on the database's clock.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_orders_in_flight",
			Help: "Orders running on this instance.",
		}),
		caUnreachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_ca_unreachable",
			Help: "1 while this instance's last order found the CA unreachable (ordering is paused for every instance), else 0.",
		}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_lease_renewal_failures_total",
			Help: "Lease renewals that could not reach the database.",
		}),
		badRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_bad_rows_total",
			Help: "Rows a step could not use and skipped (an unusable certificate row, two domains differing only in case), each counted once.",
		}),
		renewalReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_renewal_info_reads_total",
			Help: "Renewal-information (ARI) reads this instance sent the CA, by outcome: window, none (the CA offers none), refused, unavailable.",
		}, []string{"outcome"}),
		caOrders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_ca_orders_total",
			Help: "Finished orders by the CA they went to (primary: --acme-directory, fallback: --acme-fallback-directory) and outcome (as certworker_issuance_total's, and refused_first: the first CA refused the name, and the second is asked; refused_second: the second refused it, and the domain waits for the first; caa_other_ca, caa_waits, caa_refused, caa_failed: the name's CAA records sent it to the other CA, made it wait for the first, allow neither, or could not be read).",
		}, []string{"ca", "outcome"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_fallback_decisions_total",
			Help: "Orders sent to the second CA, by cause: outage, rate_limit, ledger (the first CA held the domain back for longer than --acme-fallback-after), refused (the first refused the name), renewal (the certificate is the second's and the first is held back).",
		}, []string{"cause"}),
		secondCAUnreachable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_fallback_ca_unreachable",
			Help: "1 while this instance's last order at the second CA (--acme-fallback-directory) found it unreachable, else 0.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.wakeups, m.claims, m.outcomes, m.durations, m.wakeLatency, m.inflight,
			m.caUnreachable, m.heartbeats, m.badRows, m.renewalReads, m.caOrders, m.fallbacks, m.secondCAUnreachable)
	}
	return m
}

func (m *metrics) wake(source string) { m.wakeups.WithLabelValues(source).Inc() }

func (m *metrics) claimed(c issuing.Claim, source string) {
	m.claims.WithLabelValues(source).Inc()
	if !c.DueAt.IsZero() && !c.ClaimedAt.Before(c.DueAt) {
		m.wakeLatency.Observe(c.ClaimedAt.Sub(c.DueAt).Seconds())
	}
}

func (m *metrics) outcome(outcome string, d time.Duration) {
	m.outcomes.WithLabelValues(outcome).Inc()
	if d > 0 {
		m.durations.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

func (m *metrics) setInflight(n int) { m.inflight.Set(float64(n)) }

func (m *metrics) setCAUnreachable(label string, down bool) {
	v := 0.0
	if down {
		v = 1
	}
	if label == "fallback" {
		m.secondCAUnreachable.Set(v)
		return
	}
	m.caUnreachable.Set(v)
}

func (m *metrics) caOrder(label, outcome string) { m.caOrders.WithLabelValues(label, outcome).Inc() }

func (m *metrics) fallback(cause string) { m.fallbacks.WithLabelValues(cause).Inc() }

func (m *metrics) heartbeatFailed() { m.heartbeats.Inc() }

func (m *metrics) renewalInfo(outcome string) { m.renewalReads.WithLabelValues(outcome).Inc() }

func (m *metrics) badRow() { m.badRows.Inc() }
