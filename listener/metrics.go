package listener

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the listener's collectors, updated even when not exported.
type metrics struct {
	connected     prometheus.Gauge
	reconnects    prometheus.Counter
	notifications prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "certworker_listener_connected",
			Help: "1 while the listener holds a live connection that is listening on certworker_wake, 0 otherwise.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_listener_reconnects_total",
			Help: "Successful connections of the listener after its first one.",
		}),
		notifications: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "certworker_listener_notifications_total",
			Help: "Notifications received on certworker_wake, before wake-ups are merged.",
		}),
	}
	if reg == nil {
		return m
	}
	m.connected = register(reg, m.connected)
	m.reconnects = register(reg, m.reconnects)
	m.notifications = register(reg, m.notifications)
	return m
}

// register registers c, or returns the collector already registered under its name,
// so that a second Listener on the same registry shares the series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	panic(err)
}
