package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// TestRailOutagePausesClaims: while the rail drops every connection, an
// executor stops claiming new payouts after railgate.TripAfter submissions got no
// usable answer (payouts_executor_rail_paused = 1), instead of turning every
// PENDING payout into RAIL_AMBIGUOUS; its probes get no answer either and
// the pause grows. Once the rail answers again, a probe is paid, claims
// resume and every payout left PENDING is paid.
func TestRailOutagePausesClaims(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	if _, err := s.rail.SetFaults(ctx, railclient.Faults{DropBeforeAccept: 1}.Full()); err != nil {
		t.Fatal(err)
	}
	const accounts = 40
	ids := make([]string, accounts)
	for i := range ids {
		acc := fmt.Sprintf("gate-%02d", i)
		if _, err := s.pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: acc, Currency: "EUR", OpeningBalance: 1_000}); err != nil {
			t.Fatal(err)
		}
		ids[i] = acc + "-p"
		if _, err := s.pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: ids[i], AccountID: acc, Amount: 100, Currency: "EUR", BeneficiaryRef: "BEN-" + ids[i]}); err != nil {
			t.Fatal(err)
		}
	}
	logs := newSyncBuf()
	cfg := s.config(t, "exec-gate", logs)
	reg := cfg.Registry
	_, stop := startExecutor(t, cfg)
	defer stop()

	waitFor(t, 2*time.Minute, "claims to pause and a probe to get no answer", func() bool {
		return gathered(t, reg, "payouts_executor_rail_paused") == 1 &&
			strings.Contains(logs.String(), "the probe payout got no usable answer")
	})
	// Up to the trip, the payouts the workers had in hand when it came, and
	// the probes: the rest stays PENDING.
	claimed := 0
	for _, id := range ids {
		if s.state(t, id) != pc.Pending {
			claimed++
		}
	}
	t.Logf("%d of %d payouts claimed during the outage", claimed, accounts)
	if limit := railgate.TripAfter + 2*cfg.Concurrency + 2; claimed > limit {
		t.Fatalf("%d of %d payouts were claimed during the outage, want at most %d", claimed, accounts, limit)
	}
	if gathered(t, reg, "payouts_executor_rail_pauses_total") != 1 {
		t.Errorf("payouts_executor_rail_pauses_total = %v, want 1", gathered(t, reg, "payouts_executor_rail_pauses_total"))
	}

	if _, err := s.rail.SetFaults(ctx, railclient.Faults{}.Full()); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, id := range ids {
		if s.state(t, id) == pc.Pending {
			left = append(left, id)
		}
	}
	waitFor(t, 3*time.Minute, "the payouts left PENDING to be paid once the rail answers", s.allIn(t, left, pc.Posted))
	if gathered(t, reg, "payouts_executor_rail_paused") != 0 || !strings.Contains(logs.String(), "the rail answered again") {
		t.Error("claims resumed without the gauge and the log saying so")
	}
}

// TestRailOutageAmbiguityBoundedAcrossExecutors: each executor stops
// claiming after railgate.TripAfter of its own submissions got no answer,
// so N executors alone would forward N times that many into an outage,
// each payout then RAIL_AMBIGUOUS with its money held. The proxy sees
// every submission and pauses forwarding after TripAfter in a row: the
// others are answered "not forwarded", their payouts stay RAIL_SUBMITTED
// and are paid once the rail answers. Three executors here forward about
// TripAfter, not three times it.
func TestRailOutageAmbiguityBoundedAcrossExecutors(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ctx := context.Background()
	if _, err := s.rail.SetFaults(ctx, railclient.Faults{DropBeforeAccept: 1}.Full()); err != nil {
		t.Fatal(err)
	}
	const accounts, executors = 60, 3
	ids := make([]string, accounts)
	for i := range ids {
		ids[i] = s.fundedPage(t, fmt.Sprintf("amb-%02d", i), 1)[0]
	}
	regs := make([]*prometheus.Registry, executors)
	for i := range executors {
		cfg := s.config(t, fmt.Sprintf("exec-amb-%d", i), io.Discard)
		regs[i] = cfg.Registry
		_, stop := startExecutor(t, cfg)
		defer stop()
	}
	proxyURL := s.st.Ready.ProxyURL
	waitFor(t, 2*time.Minute, "every executor to pause its claims", func() bool {
		for _, reg := range regs {
			if gathered(t, reg, "payouts_executor_rail_paused") != 1 {
				return false
			}
		}
		return true
	})
	forwarded := scraped(t, proxyURL, `payouts_proxy_submissions_total{outcome="TIMEOUT"}`)
	// The trip, the submissions already in flight when it came (each
	// executor's workers), and a probe or two while the others paused.
	limit := float64(railgate.TripAfter + executors*2 + 3)
	t.Logf("%v submissions forwarded into the outage by %d executors (each alone would stop after %d)", forwarded, executors, railgate.TripAfter)
	if forwarded > limit {
		t.Fatalf("%v submissions were forwarded into the outage, want at most %v", forwarded, limit)
	}
	if scraped(t, proxyURL, "payouts_proxy_rail_paused") != 1 || scraped(t, proxyURL, "payouts_proxy_paused_submissions_total") == 0 {
		t.Fatal("the proxy did not pause forwarding")
	}

	if _, err := s.rail.SetFaults(ctx, railclient.Faults{}.Full()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 4*time.Minute, "every payout to be paid or ambiguous once the rail answers", func() bool {
		for _, id := range ids {
			if st := s.state(t, id); st != pc.Posted && st != pc.RailAmbiguous {
				return false
			}
		}
		return true
	})
	ambiguous := 0
	for _, id := range ids {
		if s.state(t, id) == pc.RailAmbiguous {
			ambiguous++
		}
	}
	if got := scraped(t, proxyURL, `payouts_proxy_submissions_total{outcome="TIMEOUT"}`); float64(ambiguous) != got {
		t.Fatalf("%d payouts ambiguous, %v forwarded without an answer: every other payout should be paid", ambiguous, got)
	}
}

// scraped is one series' value on a server's /metrics (0 when absent).
func scraped(t *testing.T, baseURL, series string) float64 {
	t.Helper()
	for _, line := range metricLines(t, baseURL) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// TestANotSentAnswerSaysNothingOfTheRail: a submission the proxy recorded
// REJECTED not_forwarded_in_time never reached the rail, so it neither
// ends the executor's rail pause nor counts toward it; a real decline does
// end it.
func TestANotSentAnswerSaysNothingOfTheRail(t *testing.T) {
	e := newBareExecutor()
	log := slog.New(slog.DiscardHandler)
	for range railgate.TripAfter {
		e.railAnswer(log, false)
	}
	if e.rail.PausedUntil().IsZero() {
		t.Fatal("the rail gate did not pause after TripAfter answers without use")
	}
	r := &run{e: e, log: log}
	report := func(p pc.Payout, _ proxyclient.Record) (pc.Payout, error) { return p, nil }
	p := pc.Payout{ID: "po-1", State: pc.RailSubmitted}
	notSent := proxyclient.Record{PayoutID: "po-1", Outcome: proxyclient.OutcomeRejected, ErrorCode: proxyclient.ErrorCodeNotForwardedInTime}
	if _, err := r.answered(p, notSent, nil, report); err != nil {
		t.Fatal(err)
	}
	if e.rail.PausedUntil().IsZero() {
		t.Fatal("a submission that was never sent ended the rail pause")
	}
	declined := proxyclient.Record{PayoutID: "po-1", Outcome: proxyclient.OutcomeRejected, ErrorCode: "beneficiary_declined"}
	if _, err := r.answered(p, declined, nil, report); err != nil {
		t.Fatal(err)
	}
	if !e.rail.PausedUntil().IsZero() {
		t.Fatal("the rail's own decline did not end the pause")
	}
}

// TestAProxyShuttingDownSaysNothingOfTheRail: a proxy that refuses
// submissions while it shuts down (503, nothing recorded or forwarded)
// says nothing of the rail, so a batch sent to it does not pause the
// executor's claims as a rail outage would; the proxy's own pause does
// count.
func TestAProxyShuttingDownSaysNothingOfTheRail(t *testing.T) {
	e := newBareExecutor()
	log := slog.New(slog.DiscardHandler)
	r := &run{e: e, log: log}
	report := func(p pc.Payout, _ proxyclient.Record) (pc.Payout, error) { return p, nil }
	p := pc.Payout{ID: "po-1", State: pc.RailSubmitted}
	unforwarded := problem.New(problem.Unavailable, "not recorded, not forwarded").With(proxyclient.ForwardedExtension, false)
	down := problem.New(problem.Unavailable, "shutting down").With(proxyclient.ForwardedExtension, false).With(proxyclient.ShuttingDownExtension, true)
	for range 2 * railgate.TripAfter {
		if _, err := r.answered(p, proxyclient.Record{}, down, report); !errors.Is(err, errLeave) {
			t.Fatalf("a submission refused by a proxy shutting down: %v; want the payout left for a later pass", err)
		}
	}
	if !e.rail.PausedUntil().IsZero() {
		t.Fatal("a proxy shutting down paused the executor's claims as a rail outage")
	}
	for range railgate.TripAfter {
		_, _ = r.answered(p, proxyclient.Record{}, unforwarded, report)
	}
	if e.rail.PausedUntil().IsZero() {
		t.Fatal("the proxy's rail pause did not count toward the executor's")
	}
}

// An account whose round left PENDING payouts unclaimed because claims
// are paused waits for the pause, not longer: once the rail answers again
// it is worked on at once, not when the pause would have run out.
func TestAnAccountLeftByAPauseIsWorkedOnOnceItEnds(t *testing.T) {
	e := newBareExecutor()
	log := slog.New(slog.DiscardHandler)
	for range railgate.TripAfter {
		e.railAnswer(log, false)
	}
	now := time.Now()
	e.finishRound(log, "acc-1", roundResult{acquired: true, gated: true}, now)
	if e.reserve("acc-1", now) {
		t.Fatal("an account whose round the pause gated was worked on again while the pause lasts")
	}
	e.railAnswer(log, true) // the rail answered: claims resume
	if !e.reserve("acc-1", now) {
		t.Fatal("an account whose round the pause gated still waits after the pause ended")
	}
}

// TestABatchWhoseProbeWasPaidDoesNotPauseClaims: while its rail is paused
// the proxy forwards one item of a batch as its probe and answers the
// others unforwarded (503, "forwarded": false). The rail paid the probe,
// so the batch ends no pause and starts none, however many items came
// back unforwarded after it; a batch of unforwarded items alone counts
// once toward the pause. Before, each unforwarded item counted after the
// probe's answer, and a batch of nine tripped the pause just as the rail
// had paid.
func TestABatchWhoseProbeWasPaidDoesNotPauseClaims(t *testing.T) {
	e := newBareExecutor()
	log := slog.New(slog.DiscardHandler)
	b := &batch{r: &run{e: e, log: log}}
	collect := func(p pc.Payout, _ proxyclient.Record) (pc.Payout, error) { return p, errQueued }
	unforwarded := problem.New(problem.Unavailable, "not recorded, not forwarded").With(proxyclient.ForwardedExtension, false)
	batchOf := func(probe *proxyclient.Record) ([]pc.Payout, []submitAnswer) {
		ps := make([]pc.Payout, railgate.TripAfter+1)
		answers := make([]submitAnswer, len(ps))
		for i := range ps {
			ps[i] = pc.Payout{ID: fmt.Sprintf("po-%d", i), State: pc.RailSubmitted, Amount: 100, Currency: "EUR"}
			answers[i].err = unforwarded
		}
		if probe != nil {
			answers[0] = submitAnswer{rec: *probe}
			answers[0].rec.PayoutID = ps[0].ID
		}
		return ps, answers
	}
	ps, answers := batchOf(&proxyclient.Record{Outcome: proxyclient.OutcomeAcked, RailRef: "rl-1"})
	b.fileAnswers(ps, answers, collect)
	if !e.rail.PausedUntil().IsZero() {
		t.Fatal("a batch whose probe the rail paid paused the executor's claims")
	}
	for range railgate.TripAfter - 1 {
		ps, answers := batchOf(nil)
		b.fileAnswers(ps, answers, collect)
	}
	if !e.rail.PausedUntil().IsZero() {
		t.Fatalf("%d batches of unforwarded items paused claims: each should count once", railgate.TripAfter-1)
	}
	ps, answers = batchOf(nil)
	b.fileAnswers(ps, answers, collect)
	if e.rail.PausedUntil().IsZero() {
		t.Fatalf("%d batches of unforwarded items in a row did not pause claims", railgate.TripAfter)
	}
}
