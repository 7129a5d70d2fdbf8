package railproxy

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/railproxy/proxyclient"
)

type metrics struct {
	submissions   *prometheus.CounterVec   // by outcome
	fencedOut     prometheus.Counter       // alert on any increase
	duplicates    prometheus.Counter       // pages
	safetyEvents  *prometheus.CounterVec   // by kind
	railLatency   *prometheus.HistogramVec // by outcome
	resolutions   *prometheus.CounterVec   // by resolution
	recordFailure prometheus.Counter       // outcome could not be recorded
	evidenceLost  prometheus.Counter       // a safety event's row could not be stored
	outcomeGroup  prometheus.Histogram     // outcomes written per statement
	guardDisabled prometheus.Gauge         // 1 in a negativecontrol build
	// The rail pause (pause.go).
	railPaused     prometheus.Gauge
	railPauses     prometheus.Counter
	pausedRefusals prometheus.Counter
	// What the rail held when a resubmission was checked (railHolds).
	resubmissionChecks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_proxy_submissions_total",
			Help: "Submission attempts by outcome: ACKED, REJECTED, TIMEOUT (ambiguous), FENCED (stale token, not forwarded).",
		}, []string{"outcome"}),
		fencedOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_fenced_out_total",
			Help: "Submissions refused because their fencing token is stale at the proxy. Any increase is a safety net firing.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_duplicate_attempts_total",
			Help: "Submissions refused because the payout already has a forwarded submission. Any increase pages.",
		}),
		safetyEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_proxy_safety_events_total",
			Help: "Safety events raised by the proxy, by kind (fenced_out, token_regression, duplicate_attempt), their row stored or not (payouts_proxy_safety_event_write_failures_total counts the rows lost).",
		}, []string{"kind"}),
		railLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "payouts_proxy_rail_request_duration_seconds",
			Help:    "Latency of payment requests to the rail, by the outcome they produced.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"outcome"}),
		resolutions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_proxy_resolutions_total",
			Help: "Ambiguous submissions resolved from rail evidence, by resolution (SETTLED, ABSENT).",
		}, []string{"resolution"}),
		recordFailure: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_outcome_record_failures_total",
			Help: "Rail answers that could not be recorded (the submission stays without outcome, i.e. ambiguous).",
		}),
		evidenceLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_safety_event_write_failures_total",
			Help: "Safety events (fenced_out, duplicate_attempt) whose evidence could not be stored in proxydb: the refusal stood and the log line and counters fired, but the row is missing. Alert on any increase.",
		}),
		outcomeGroup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "payouts_proxy_outcome_group_size",
			Help:    "Outcomes written per statement: the outcomes recorded while the previous group was being written are written together.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
		guardDisabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_proxy_guard_disabled",
			Help: "1 when this binary was built with the negativecontrol tag (fence condition removed). Must be 0 in production.",
		}),
		railPaused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "payouts_proxy_rail_paused",
			Help: "1 while the proxy forwards no new submissions because the rail gave no usable answer to several in a row (one probe submission per pause).",
		}),
		railPauses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_rail_pauses_total",
			Help: "Times the proxy stopped forwarding new submissions after several in a row got no usable answer from the rail.",
		}),
		pausedRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_paused_submissions_total",
			Help: "Submissions answered 503 while the rail is paused: not recorded, not forwarded (nothing was sent); the executor submits them again later.",
		}),
		resubmissionChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_proxy_resubmission_checks_total",
			Help: "Resubmissions (D-4) checked at the rail before forwarding, by what the rail held: absent (forwarded), held (recorded from the rail's payment, not sent; a duplicate_attempt event), unconfirmed (no final answer: answered 503, not recorded, not sent).",
		}, []string{"rail"}),
	}
	reg.MustRegister(m.submissions, m.fencedOut, m.duplicates, m.safetyEvents, m.railLatency, m.resolutions, m.recordFailure, m.evidenceLost, m.outcomeGroup, m.guardDisabled,
		m.railPaused, m.railPauses, m.pausedRefusals, m.resubmissionChecks)
	if !guardEnabled {
		m.guardDisabled.Set(1)
	}
	// Every kind exported at 0 from the start: the first event after a
	// start is then an increase an alert sees, not a new series at 1.
	for _, k := range []string{proxyclient.KindFencedOut, proxyclient.KindTokenRegression, proxyclient.KindDuplicateAttempt} {
		m.safetyEvents.WithLabelValues(k)
	}
	for _, o := range []proxyclient.Outcome{proxyclient.OutcomeAcked, proxyclient.OutcomeRejected, proxyclient.OutcomeTimeout, proxyclient.OutcomeFenced} {
		m.submissions.WithLabelValues(string(o)) // PayoutsAmbiguousBurst sees the first TIMEOUT
	}
	for _, r := range []string{"absent", "held", "unconfirmed"} {
		m.resubmissionChecks.WithLabelValues(r)
	}
	return m
}

// unresolvedCollector reports, at scrape time, forwarded submissions with
// no outcome older than minAge, the send window and the rail timeout
// together (forwarding died or is stuck), and
// TIMEOUT submissions not yet resolved. Both are "money may have moved".
type unresolvedCollector struct {
	st        *store
	minAge    time.Duration
	log       *slog.Logger
	noOutcome *prometheus.Desc
	timeouts  *prometheus.Desc
	errors    prometheus.Counter
}

func newUnresolvedCollector(st *store, minAge time.Duration, log *slog.Logger) *unresolvedCollector {
	return &unresolvedCollector{
		st: st, minAge: minAge, log: log,
		noOutcome: prometheus.NewDesc("payouts_proxy_submissions_without_outcome",
			"Forwarded submissions with no recorded outcome older than the send window and the rail timeout together (ambiguous; need lookup).", nil, nil),
		timeouts: prometheus.NewDesc("payouts_proxy_submissions_timeout_unresolved",
			"Submissions with outcome TIMEOUT and no resolution yet (ambiguous; need lookup).", nil, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_proxy_unresolved_scrape_errors_total",
			Help: "Counts of unresolved submissions from proxydb that failed or timed out: that scrape lacks payouts_proxy_submissions_without_outcome and payouts_proxy_submissions_timeout_unresolved; the rest of /metrics is served.",
		}),
	}
}

func (c *unresolvedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.noOutcome
	ch <- c.timeouts
	c.errors.Describe(ch)
}

func (c *unresolvedCollector) Collect(ch chan<- prometheus.Metric) {
	// A failed count leaves its two gauges out and is counted; it does not
	// fail the scrape: an invalid metric made the whole /metrics a 500
	// while proxydb was down, so the proxy looked down (up == 0) and its
	// fenced_out and duplicate counters vanished with it.
	defer c.errors.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, t, err := c.st.unresolvedCounts(ctx, c.minAge)
	if err != nil {
		c.errors.Inc()
		c.log.Warn("could not count unresolved submissions for /metrics", "error", err.Error())
		return
	}
	ch <- prometheus.MustNewConstMetric(c.noOutcome, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.GaugeValue, float64(t))
}
