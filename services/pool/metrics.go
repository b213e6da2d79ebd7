package pool

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pool's own Prometheus series, beside the per-RPC ones every binary has.
type metrics struct {
	runsStarted     prometheus.Counter
	runsEnded       *prometheus.CounterVec
	sessionsSpawned prometheus.Counter
	sessionsStopped prometheus.Counter
	listings        prometheus.Counter
	calls           *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		runsStarted: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringfence_pool_runs_started_total", Help: "Runs started."}),
		runsEnded:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringfence_pool_runs_ended_total", Help: "Runs ended, by final state."}, []string{"state"}),
		sessionsSpawned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_sessions_spawned_total", Help: "MCP sessions started for runs."}),
		sessionsStopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_sessions_stopped_total", Help: "MCP sessions of runs stopped (each exactly once)."}),
		listings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_listings_total", Help: "tools/list taken for drift checks."}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_calls_total", Help: "Tool-call attempts by outcome, result and reason or failure class."},
			[]string{"outcome", "result", "reason"}),
	}
}

func (m *metrics) collectors(s *Service) []prometheus.Collector {
	return []prometheus.Collector{
		m.runsStarted, m.runsEnded, m.sessionsSpawned, m.sessionsStopped, m.listings, m.calls,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_sessions_live", Help: "MCP sessions alive now."},
			func() float64 { return float64(s.liveSessions.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_audit_spool_pending", Help: "Audit records waiting to be forwarded."},
			func() float64 { return float64(s.spool.Pending()) }),
	}
}
