package queue

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the worker's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	wakeups     *prometheus.CounterVec
	claims      prometheus.Counter
	outcomes    *prometheus.CounterVec
	durations   *prometheus.HistogramVec
	wakeLatency prometheus.Histogram
	inflight    prometheus.Gauge
}

// NewMetrics registers the worker's metrics on reg. The queue depth by status
// (certworker_queue_domains) is reported by the fleet statistics, read on a timer
// (cmd/certworker/fleet.go), not here at every scrape.
func NewMetrics(reg prometheus.Registerer, q *Queue) *Metrics {
	m := &Metrics{
		wakeups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_wakeups_total",
			Help: "Passes over the queue, by what woke the worker (notify, reconnect, timer, poll).",
		}, []string{"source"}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_claims_total",
			Help: "Domains claimed by this instance.",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "certworker_issuance_total",
			Help: "Finished orders by outcome: issued, failed, gave_up, invalid, rate_limited, released, lost.",
		}, []string{"outcome"}),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "certworker_issuance_duration_seconds",
			Help:    "Time from claim to recorded result, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
		}, []string{"outcome"}),
		wakeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "certworker_wake_latency_seconds",
			Help:    "Time from a domain becoming due (the commit that made it claimable, or its backoff running out) to its claim.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_orders_in_flight",
			Help: "Orders running on this instance.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.wakeups, m.claims, m.outcomes, m.durations, m.wakeLatency, m.inflight)
	}
	return m
}

func (m *Metrics) wake(source string) {
	if m != nil {
		m.wakeups.WithLabelValues(source).Inc()
	}
}

func (m *Metrics) claimed(c Claim) {
	if m == nil {
		return
	}
	m.claims.Inc()
	if !c.DueAt.IsZero() && !c.ClaimedAt.Before(c.DueAt) {
		m.wakeLatency.Observe(c.ClaimedAt.Sub(c.DueAt).Seconds())
	}
}

func (m *Metrics) finished(outcome string, d time.Duration) {
	if m != nil {
		m.outcomes.WithLabelValues(outcome).Inc()
		m.durations.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

func (m *Metrics) setInflight(n int) {
	if m != nil {
		m.inflight.Set(float64(n))
	}
}
