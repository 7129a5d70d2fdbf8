package reconcile

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the reconciler's Prometheus series: served on /metrics in
// continuous mode and written to --metrics-file (node_exporter textfile
// collector) after every pass. deploy/prometheus/alerts.yml alerts on them.
type Metrics struct {
	findings      *prometheus.GaugeVec
	resolved      *prometheus.CounterVec
	passes        *prometheus.CounterVec
	unresolved    prometheus.Gauge
	highestFence  prometheus.Gauge
	guardFence    *prometheus.GaugeVec
	lockHighToken prometheus.Gauge
	up            prometheus.Gauge
	lastRun       prometheus.Gauge
	lastSuccess   prometheus.Gauge
	duration      prometheus.Gauge
	scanned       *prometheus.GaugeVec
}

// NewMetrics registers the reconciler's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "payouts_reconcile_findings",
			Help: "Findings of the last completed reconciliation pass, by invariant and check (0 when clean). Any non-zero value needs an operator; see docs/operations.md.",
		}, []string{"invariant", "check"}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_reconcile_resolved_total",
			Help: "Ambiguous payouts resolved from rail evidence, by resolution (SETTLED, ABSENT).",
		}, []string{"resolution"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_reconcile_passes_total",
			Help: "Reconciliation passes by result: clean, findings, failed (could not run).",
		}, []string{"result"}),
		unresolved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_ambiguous_unresolved",
			Help: "Ambiguous payouts the last pass looked at and left (rail not final, lock held, lookup failed).",
		}),
		highestFence: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_highest_fence",
			Help: "Highest fence either guard stores; a restored PostgreSQL lock service must be bumped above it (DESIGN D-13).",
		}),
		guardFence: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "payouts_reconcile_guard_high_fence",
			Help: "Highest fence stored by each guard (payment, proxy).",
		}, []string{"guard"}),
		lockHighToken: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_lock_high_token",
			Help: "The lock service's high token: at or above every token it has issued, below every one it will issue.",
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_up",
			Help: "1 when the last reconciliation pass completed, 0 when it could not run.",
		}),
		lastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_last_run_timestamp_seconds",
			Help: "Unix time the last pass ended (completed or not).",
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_last_success_timestamp_seconds",
			Help: "Unix time the last completed pass ended.",
		}),
		duration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_reconcile_pass_duration_seconds",
			Help: "How long the last pass took.",
		}),
		scanned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "payouts_reconcile_scanned",
			Help: "Objects the last completed pass read, by kind.",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.findings, m.resolved, m.passes, m.unresolved, m.highestFence, m.guardFence, m.lockHighToken,
		m.up, m.lastRun, m.lastSuccess, m.duration, m.scanned)
	for _, res := range []string{"SETTLED", "ABSENT"} {
		m.resolved.WithLabelValues(res)
	}
	for _, res := range []string{"clean", "findings", "failed"} {
		m.passes.WithLabelValues(res)
	}
	return m
}

// Observe records one pass: its report when it completed, or only that it
// could not run (the findings of the last completed pass stay); a pass
// whose checks completed but that could not resolve every ambiguous payout
// is not up, and its findings replace the last ones.
func (m *Metrics) Observe(rep *Report, err error, took time.Duration, end time.Time) {
	m.lastRun.Set(float64(end.Unix()))
	m.duration.Set(took.Seconds())
	if rep != nil {
		for _, x := range rep.Resolved {
			m.resolved.WithLabelValues(x.Resolution).Inc()
		}
	}
	switch {
	case err != nil || rep == nil:
		m.up.Set(0)
		m.passes.WithLabelValues("failed").Inc()
		// A pass that checked everything but could not resolve every
		// ambiguous payout still tells what it found.
		if !rep.Complete() {
			return
		}
	case rep.Clean():
		m.up.Set(1)
		m.passes.WithLabelValues("clean").Inc()
		m.lastSuccess.Set(float64(end.Unix()))
	default:
		m.up.Set(1)
		m.passes.WithLabelValues("findings").Inc()
		m.lastSuccess.Set(float64(end.Unix()))
	}
	for _, c := range Checks() {
		m.findings.WithLabelValues(InvariantOf(c), c).Set(float64(rep.Counts[c]))
	}
	m.unresolved.Set(float64(len(rep.Unresolved)))
	m.highestFence.Set(float64(rep.HighestFence))
	m.guardFence.WithLabelValues("payment").Set(float64(rep.PayDBFence))
	m.guardFence.WithLabelValues("proxy").Set(float64(rep.ProxyFence))
	m.lockHighToken.Set(float64(rep.LockHighToken))
	s := rep.Scanned
	for kind, n := range map[string]int{"payouts": s.Payouts, "accounts": s.Accounts, "ledger_entries": s.LedgerEntries,
		"grants": s.Grants, "rail_payments": s.RailPayments, "safety_events": s.SafetyEvents, "high_water": s.HighWater} {
		m.scanned.WithLabelValues(kind).Set(float64(n))
	}
}
