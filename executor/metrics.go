package executor

import "github.com/prometheus/client_golang/prometheus"

// Step results (the result label of payouts_executor_steps_total).
const (
	resultOK         = "ok"
	resultFencedOut  = "fenced_out"
	resultTransient  = "transient"    // no answer or 5xx: retried (claim, post, outcome) or looked up (submit)
	resultRejected   = "rejected"     // invalid_transition: the payout moved under us; re-read
	resultExists     = "exists"       // submission_exists: resolved from the existing record
	resultClientFail = "client_error" // invalid_request, not_found, forbidden: a defect, the account is left alone
)

type metrics struct {
	outcomes     *prometheus.CounterVec
	steps        *prometheus.CounterVec
	stepLatency  *prometheus.HistogramVec
	fencedOut    *prometheus.CounterVec
	acquires     *prometheus.CounterVec
	sessions     *prometheus.CounterVec
	lockDown     prometheus.Gauge
	activeGrants prometheus.Gauge
	keptGrants   prometheus.Gauge
	cooldowns    prometheus.Counter
	railPaused   prometheus.Gauge
	railPauses   prometheus.Counter
	hooks        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_payouts_total",
			Help: "Payouts this executor brought to where it stops: POSTED, FAILED or RAIL_AMBIGUOUS (ambiguous ones wait for evidence).",
		}, []string{"outcome"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_steps_total",
			Help: "Steps attempted, by step (claim, reclaim, submitting, submit, lookup, outcome, post) and result.",
		}, []string{"step", "result"}),
		stepLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "payouts_executor_step_duration_seconds",
			Help:    "Latency of each step's call to a guard or the proxy.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"step"}),
		fencedOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_fenced_out_total",
			Help: "Writes a guard refused because this executor's token was stale (guard: payment or proxy). Any occurrence means a grant was lost mid-flight; investigate pauses and lock-service health.",
		}, []string{"guard"}),
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_lock_acquires_total",
			Help: "Grants of payout:{account} a round ran under: acquired (from the lock service), kept (the grant kept from the account's previous round, no lock-service call), held (another executor has it; normal) or error (lock service unreachable: fail closed).",
		}, []string{"result"}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_sessions_total",
			Help: "Lock sessions: opened, open_failed (lock service unreachable), lost (client deadline passed), closed.",
		}, []string{"event"}),
		lockDown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_executor_lock_unavailable",
			Help: "1 while the executor has no healthy lock session (none open, or its session in jeopardy) and therefore starts nothing (fail closed).",
		}),
		activeGrants: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_executor_active_grants",
			Help: "Accounts a worker of this executor is on, under the account's lock.",
		}),
		keptGrants: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_executor_kept_grants",
			Help: "Grants kept after a round for the account's next one (--grant-linger), held with no worker on them.",
		}),
		cooldowns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_executor_account_cooldowns_total",
			Help: "Rounds that took an account's lock and moved no payout (fenced out, refused by the proxy, outcome not known yet): the account is left alone for a while.",
		}),
		railPaused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_executor_rail_paused",
			Help: "1 while the executor claims no new payouts because its recent submissions got no usable answer from the rail (one probe payout per pause); payouts in flight are still finished.",
		}),
		railPauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_executor_rail_pauses_total",
			Help: "Times the executor stopped claiming new payouts after submissions in a row got no usable answer from the rail.",
		}),
		hooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_executor_test_hooks_total",
			Help: "Test hooks that fired (test builds only; must stay 0 in production).",
		}, []string{"hook", "point"}),
	}
	reg.MustRegister(m.outcomes, m.steps, m.stepLatency, m.fencedOut, m.acquires, m.sessions, m.lockDown, m.activeGrants, m.keptGrants, m.cooldowns, m.railPaused, m.railPauses, m.hooks)
	return m
}
