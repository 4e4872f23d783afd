package router

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// routerMetrics are the figures only a router has, next to the shared set.
type routerMetrics struct {
	healthy *prometheus.GaugeVec   // url, role
	retries *prometheus.CounterVec // stage
	// migrations counts requests moved to another pair after tokens
	// reached the caller, by reason (migrateReasons).
	migrations *prometheus.CounterVec
	picks      *prometheus.CounterVec // url, role
	mismatch   prometheus.Counter
	// localPrefills counts attempts whose decode worker computed the
	// prompt itself, with no handoff (Router.computesHere).
	localPrefills prometheus.Counter
}

// retryStages are the steps whose failure before the first token is tried
// again on another pair, and spec_anomaly: a request decode's spec guard
// stopped, continued on another pair from the tokens the client has.
var retryStages = []string{"reserve", "stream", "prefill", "decode", "generate", "spec_anomaly"}

func newRouterMetrics(reg prometheus.Registerer) *routerMetrics {
	rm := &routerMetrics{
		healthy: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_router_worker_healthy", Help: "1 when the worker answered its last probe (health, server_info and gRPC Info), else 0.",
		}, []string{"url", "role"})),
		retries: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_retries_total", Help: "Requests tried again on another pair before their first token, by the step that failed (spec_anomaly: continued after the tokens the client has).",
		}, []string{"stage"})),
		migrations: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_migrations_total", Help: "Requests continued on another pair after tokens reached the client, from the tokens it has, by reason (decode_gone: the token stream broke; decode_error: decode reported a failure of its own; spec_guard: decode's spec guard stopped it; drain: a draining decode worker handed it back).",
		}, []string{"reason"})),
		picks: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_router_worker_requests_total", Help: "Requests (attempts included) sent to each worker.",
		}, []string{"url", "role"})),
		mismatch: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_router_layout_mismatch_total", Help: "Prefill/decode pairs refused because their KV layouts differ (counted once per difference seen).",
		})),
		localPrefills: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_router_local_prefill_total", Help: "Attempts sent to a decode worker alone, which computed the prompt itself with no handoff (its uncached part was at most --disagg-prefill-threshold tokens, or the worker held most of it).",
		})),
	}
	for _, st := range retryStages {
		rm.retries.WithLabelValues(st)
	}
	for _, why := range migrateReasons {
		rm.migrations.WithLabelValues(why)
	}
	return rm
}

// register adds c to reg, or returns the collector already there, so that
// two routers sharing one metric set (tests) do not panic.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
