package payment

import (
	"github.com/prometheus/client_golang/prometheus"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// metrics are the payment resource's domain metrics. Every safety counter
// should stay at zero; any increase is incident-grade and alerted on.
type metrics struct {
	transitions         *prometheus.CounterVec
	fencedOut           prometheus.Counter
	tokenRegressions    prometheus.Counter
	rejectedTransitions *prometheus.CounterVec
	safetyWriteFailures prometheus.Counter
	driftAccounts       prometheus.Gauge
	driftGroups         prometheus.Gauge
	driftChecks         *prometheus.CounterVec
	workFallbacks       prometheus.Counter
	workWaits           prometheus.Counter
	createBatch         prometheus.Histogram
	guardDisabled       prometheus.Gauge // 1 in a negativecontrol build
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_payment_transitions_total",
			Help: "Accepted payout state transitions, by from and to state.",
		}, []string{"from", "to"}),
		fencedOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_fenced_out_total",
			Help: "Mutations refused by guard 1 because their token was not above the account's fence (INV-05). Alert on any increase.",
		}),
		tokenRegressions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_token_regressions_total",
			Help: "Mutations presenting the account's current fence token from a different holder: a token was re-issued (INV-04). Alert on any increase.",
		}),
		rejectedTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_payment_rejected_transitions_total",
			Help: "Requests whose event is not allowed in the payout's state (INV-08), by state and event. Alert on any increase.",
		}, []string{"state", "event"}),
		safetyWriteFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_safety_event_write_failures_total",
			Help: "Safety events that could not be stored in safety_event (the log line and counters still fired).",
		}),
		driftAccounts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_payment_ledger_drift_accounts",
			Help: "Accounts whose balance differs from the sum of their ledger entries at the last check (INV-03). Should be 0.",
		}),
		driftGroups: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_payment_ledger_unbalanced_groups",
			Help: "Ledger groups whose entries do not sum to zero at the last check (INV-03). Should be 0.",
		}),
		driftChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_payment_ledger_checks_total",
			Help: "Runs of the continuous ledger check, by result (clean, drift, error).",
		}, []string{"result"}),
		workFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_work_full_walks_total",
			Help: "GET /work calls whose first read of the longest-waiting payouts named too few accounts, so every account with work was walked. A steady rate means a few accounts hold long queues.",
		}),
		workWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_work_waits_total",
			Help: "Times a GET /work call with wait_ms found no work and waited for a payout to be created (each wake-up that finds none waits again).",
		}),
		createBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "payouts_payment_create_batch_payouts",
			Help:    "Payouts created per database statement: creations that arrive while one is written go out together.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		guardDisabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_payment_guard_disabled",
			Help: "1 when this binary was built with the negativecontrol tag (guard 1's fence condition and the transition table compiled out). Must be 0 in production.",
		}),
	}
	reg.MustRegister(m.transitions, m.fencedOut, m.tokenRegressions, m.rejectedTransitions,
		m.safetyWriteFailures, m.driftAccounts, m.driftGroups, m.driftChecks, m.workFallbacks, m.workWaits, m.createBatch,
		m.guardDisabled)
	if !guardEnabled || !transitionTableEnabled {
		m.guardDisabled.Set(1)
	}
	// Every refusable (state, event) exported at 0 from the start: the
	// first refusal after a start is then an increase an alert sees, not
	// a new series whose first sample is already 1.
	for _, st := range pc.States {
		for _, ev := range Events {
			if _, ok := Next(st, ev); !ok {
				m.rejectedTransitions.WithLabelValues(string(st), string(ev))
			}
		}
	}
	for _, r := range []string{"clean", "drift", "error"} {
		m.driftChecks.WithLabelValues(r) // PayoutsLedgerCheckFailing counts the first error
	}
	return m
}
