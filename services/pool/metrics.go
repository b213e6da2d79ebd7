package pool

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringfence/ringfence/internal/audit"
)

// metrics are the pool's own Prometheus series, beside the per-RPC ones every binary has.
type metrics struct {
	runsStarted     prometheus.Counter
	runsEnded       *prometheus.CounterVec
	sessionsSpawned prometheus.Counter
	sessionsStopped prometheus.Counter
	listings        prometheus.Counter
	calls           *prometheus.CounterVec
	serverCalls     *prometheus.HistogramVec
	warmHits        *prometheus.CounterVec
	warmMisses      *prometheus.CounterVec
	warmRefills     *prometheus.CounterVec
	warmDiscarded   *prometheus.CounterVec
	forwarded       prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		runsStarted: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringfence_pool_runs_started_total", Help: "Runs started."}),
		runsEnded:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ringfence_pool_runs_ended_total", Help: "Runs ended, by final state."}, []string{"state"}),
		sessionsSpawned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_sessions_spawned_total", Help: "MCP sessions started for runs (warm ones included)."}),
		sessionsStopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_sessions_stopped_total", Help: "MCP sessions of runs stopped (each exactly once)."}),
		listings: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_listings_total", Help: "tools/list taken for drift checks."}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_calls_total", Help: "Tool-call attempts by outcome, result and reason or failure class."},
			[]string{"outcome", "result", "reason"}),
		serverCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ringfence_pool_server_call_duration_seconds",
			Help: "How long MCP servers took to answer dispatched tools/call requests, by server and result (succeeded, or failed: a tool error, no answer, or an answer the gates refused).",
			// From 100 µs (a warm container answers in a few hundred) to 10 minutes, the
			// longest tool_call_timeout a registration may set.
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"server", "result"}),
		warmHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_warm_hits_total", Help: "First calls of a run to a server that took a warm session."}, []string{"server"}),
		warmMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_warm_misses_total", Help: "First calls of a run to a server with prewarm that found no warm session ready and started one cold."}, []string{"server"}),
		warmRefills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_warm_refills_total", Help: "Warm sessions started, by result (ready or failed)."}, []string{"server", "result"}),
		warmDiscarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringfence_pool_warm_discarded_total", Help: "Warm sessions stopped without serving a run, by reason (stale, expired, dead, unwanted, evicted)."}, []string{"reason"}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringfence_pool_forwarded_total", Help: "Requests about runs another pool host owns (or placed there), forwarded to it."}),
	}
}

func (m *metrics) collectors(s *Service) []prometheus.Collector {
	return []prometheus.Collector{
		m.runsStarted, m.runsEnded, m.sessionsSpawned, m.sessionsStopped, m.listings, m.calls, m.serverCalls,
		m.warmHits, m.warmMisses, m.warmRefills, m.warmDiscarded, m.forwarded,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_warm_ready", Help: "Warm sessions ready for a run's first call (counted in ringfence_pool_sessions_live too)."},
			func() float64 { return float64(s.warm.count()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_sessions_live", Help: "MCP sessions alive now, warm ones included."},
			func() float64 { return float64(s.liveSessions.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_audit_spool_pending", Help: "Audit records waiting to be forwarded."},
			func() float64 { return float64(s.spool.Pending()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_listing_watches_served", Help: "WatchAgentTools streams this host serves to other pool hosts' front doors."},
			func() float64 { return float64(s.servedWatches()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringfence_pool_leftover_containers_removed_total", Help: "Containers of this pool instance that no session or warm container held (their removal failed, or their create's answer was lost), removed while it ran."},
			func() float64 { return float64(s.reconciled()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ringfence_pool_listing_watches_held", Help: "WatchAgentTools streams this host's front door holds open to the owners of runs it has sessions of."},
			func() float64 { return float64(s.heldWatches.Load()) }),
	}
}

// observeServerCall counts one dispatched tools/call to server: took is how long the server
// took to answer (or to fail to), whatever the gates made of the answer after.
func (m *metrics) observeServerCall(server string, took time.Duration, res *CallResult, err error) {
	result := audit.ResultFailed
	if err == nil && res != nil && !res.IsError {
		result = audit.ResultSucceeded
	}
	m.serverCalls.WithLabelValues(server, result).Observe(took.Seconds())
}

// reconciled is how many leftover containers the spawner removed while the pool ran (0 for a
// spawner that does not reconcile).
func (s *Service) reconciled() int64 {
	if rc, ok := s.spawner.(interface{ Reconciled() int64 }); ok {
		return rc.Reconciled()
	}
	return 0
}
