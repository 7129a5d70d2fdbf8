package payment

import (
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// The scrape-time gauges count paydb's payouts per state exactly (every
// state present, zeros included) and give the age of the oldest ambiguous
// payout, measured from its submission by the database clock.
func TestStateCollector(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *Config) { c.ResolutionSLA = 90 * time.Minute })
	e.recountEvery(0) // every scrape recounts the terminal states too
	check := func(want map[pc.State]float64) {
		t.Helper()
		all := map[string]float64{}
		for _, s := range pc.States {
			all[string(s)] = want[s]
		}
		if got := series(t, e.reg, "payouts_payment_payouts", "state"); !maps.Equal(got, all) {
			t.Fatalf("payouts_payment_payouts = %v, want %v", got, all)
		}
	}
	check(nil)
	if age := gaugeValue(t, e.reg, "payouts_payment_oldest_ambiguous_age_seconds"); age != 0 {
		t.Fatalf("oldest ambiguous age %v with no payouts, want 0", age)
	}
	if sla := gaugeValue(t, e.reg, "payouts_payment_resolution_sla_seconds"); sla != 5400 {
		t.Fatalf("resolution SLA gauge %v, want 5400", sla)
	}

	e.account(t, "acc-1", 10_000)
	e.account(t, "acc-2", 10_000)
	for i, s := range []pc.State{pc.Pending, pc.Pending, pc.Claimed, pc.Posted, pc.Failed, pc.RailAmbiguous} {
		id := "po-" + string(rune('a'+i))
		e.payout(t, id, "acc-1", 100)
		e.drive(t, id, s, 5, "holder-a")
	}
	e.payout(t, "po-amb-2", "acc-2", 100)
	e.drive(t, "po-amb-2", pc.RailAmbiguous, 7, "holder-b")
	// The first ambiguous payout was submitted three hours ago, the second
	// one hour ago: the gauge shows the older.
	backdate(t, e, `UPDATE payout SET submitted_at = now() - interval '3 hours' WHERE id = 'po-f'`)
	backdate(t, e, `UPDATE payout SET submitted_at = now() - interval '1 hour' WHERE id = 'po-amb-2'`)
	check(map[pc.State]float64{pc.Pending: 2, pc.Claimed: 1, pc.Posted: 1, pc.Failed: 1, pc.RailAmbiguous: 2})
	if age := gaugeValue(t, e.reg, "payouts_payment_oldest_ambiguous_age_seconds"); age < 3*3600 || age > 3*3600+600 {
		t.Fatalf("oldest ambiguous age %.0fs, want about 3h (10800s)", age)
	}

	// The older one is resolved: the age follows the one left.
	if _, err := e.recon.Resolve(tctx(t), "po-f", 9, "holder-r", pc.ResolutionAbsent, "rail: no payment for the reference", ""); err != nil {
		t.Fatal(err)
	}
	check(map[pc.State]float64{pc.Pending: 2, pc.Claimed: 1, pc.Posted: 1, pc.Failed: 2, pc.RailAmbiguous: 1})
	if age := gaugeValue(t, e.reg, "payouts_payment_oldest_ambiguous_age_seconds"); age < 3600 || age > 3600+600 {
		t.Fatalf("oldest ambiguous age %.0fs after the older was resolved, want about 1h", age)
	}
}

// The age of the oldest payout in each state an executor moves on its own
// (every open state but RAIL_AMBIGUOUS, which waits for the rail and has
// its own gauge) is read at every scrape, counted from the payout's
// creation by the database clock: every such state has a series, 0 when no
// payout is in it, and no finished or ambiguous payout counts, however old.
func TestStateCollectorOldestOpenAge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ages := func() map[string]float64 {
		t.Helper()
		got := series(t, e.reg, "payouts_payment_oldest_open_age_seconds", "state")
		var want []string
		for _, s := range pc.States {
			if !s.Terminal() && s != pc.RailAmbiguous {
				want = append(want, string(s))
			}
		}
		if len(got) != len(want) {
			t.Fatalf("payouts_payment_oldest_open_age_seconds = %v, want one series for each of %v", got, want)
		}
		for _, s := range want {
			if _, ok := got[s]; !ok {
				t.Fatalf("payouts_payment_oldest_open_age_seconds = %v, no series for %s", got, s)
			}
		}
		return got
	}
	about := func(got map[string]float64, s pc.State, want float64) {
		t.Helper()
		if v := got[string(s)]; v < want || v > want+600 {
			t.Fatalf("oldest %s payout %.0fs old, want about %.0fs (all: %v)", s, v, want, got)
		}
	}
	if got := ages(); !maps.Equal(got, map[string]float64{"PENDING": 0, "CLAIMED": 0, "RAIL_SUBMITTED": 0, "RAIL_ACKED": 0}) {
		t.Fatalf("ages with no payouts: %v, want every state at 0", got)
	}

	e.account(t, "acc-1", 10_000)
	e.account(t, "acc-2", 10_000)
	e.account(t, "acc-3", 10_000)
	// Old payouts that are finished or ambiguous: none of them counts.
	e.payout(t, "po-posted", "acc-1", 100)
	e.drive(t, "po-posted", pc.Posted, 5, "holder-a")
	e.payout(t, "po-failed", "acc-1", 100)
	e.drive(t, "po-failed", pc.Failed, 5, "holder-a")
	e.payout(t, "po-abandoned", "acc-1", 100)
	e.drive(t, "po-abandoned", pc.Abandoned, 5, "holder-a")
	e.payout(t, "po-amb", "acc-1", 100)
	e.drive(t, "po-amb", pc.RailAmbiguous, 5, "holder-a")
	backdate(t, e, `UPDATE payout SET created_at = now() - interval '10 hours' WHERE id IN ('po-posted', 'po-failed', 'po-abandoned', 'po-amb')`)
	if got := ages(); !maps.Equal(got, map[string]float64{"PENDING": 0, "CLAIMED": 0, "RAIL_SUBMITTED": 0, "RAIL_ACKED": 0}) {
		t.Fatalf("ages with only finished and ambiguous payouts: %v, want every state at 0", got)
	}

	// Two hours PENDING beside a fresh PENDING one; half an hour CLAIMED.
	e.payout(t, "po-old", "acc-2", 100)
	e.payout(t, "po-new", "acc-2", 100)
	e.payout(t, "po-claimed", "acc-3", 100)
	e.drive(t, "po-claimed", pc.Claimed, 6, "holder-b")
	backdate(t, e, `UPDATE payout SET created_at = now() - interval '2 hours' WHERE id = 'po-old'`)
	backdate(t, e, `UPDATE payout SET created_at = now() - interval '30 minutes' WHERE id = 'po-claimed'`)
	got := ages()
	about(got, pc.Pending, 2*3600)
	about(got, pc.Claimed, 30*60)
	if got[string(pc.RailSubmitted)] != 0 || got[string(pc.RailAcked)] != 0 {
		t.Fatalf("ages %v: want RAIL_SUBMITTED and RAIL_ACKED at 0 (no payout there)", got)
	}

	// The old one moves on: PENDING follows the fresh one, and the age
	// still counts from creation in its new state.
	e.drive(t, "po-old", pc.RailSubmitted, 7, "holder-c")
	got = ages()
	about(got, pc.Pending, 0)
	about(got, pc.Claimed, 30*60)
	about(got, pc.RailSubmitted, 2*3600)
	if got[string(pc.RailAcked)] != 0 {
		t.Fatalf("ages %v: want RAIL_ACKED at 0", got)
	}
}

// A scrape while paydb cannot answer loses the database-read series, not
// the whole /metrics, and counts the failure.
func TestStateCollectorWithoutDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.svc.Close()
	if got := series(t, e.reg, "payouts_payment_payouts", "state"); len(got) != 0 {
		t.Fatalf("payouts by state with paydb closed: %v, want none", got)
	}
	if got := series(t, e.reg, "payouts_payment_oldest_open_age_seconds", "state"); len(got) != 0 {
		t.Fatalf("oldest open payout ages with paydb closed: %v, want none", got)
	}
	if n := series(t, e.reg, "payouts_payment_state_scrape_errors_total", "read"); n["open"] != 3 {
		t.Fatalf("scrape errors %v after three scrapes, want 3 reads of the open states", n)
	}
	if n := gaugeValue(t, e.reg, "payouts_payment_resolution_sla_seconds"); n <= 0 {
		t.Fatalf("resolution SLA gauge %v", n)
	}
}

// A scrape reads the open payouts, not the history: with thousands of
// finished payouts its statement reads the few open ones, where a count of
// every state reads them all.
func TestStateScrapeReadsOnlyOpenPayouts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000_000)
	const history = 3000
	e.plantPayouts(t, "acc-1", history, func(g int) pc.State {
		switch {
		case g%1000 == 0:
			return pc.RailAmbiguous
		case g%500 == 0:
			return pc.Pending
		}
		return pc.Posted
	})
	if n := rowsRead(t, e.svc.pool, openStateQuery); n > 20 {
		t.Errorf("a scrape's count of open payouts read %d payout rows of %d, want at most 20 (3 ambiguous, 3 pending)", n, history)
	}
	// Through an index on state (rows read do not count the entries a scan
	// of an index on another first column would pass over).
	if p := explain(t, e.svc.pool, "", openStateQuery, "SET LOCAL enable_seqscan = off"); !usesOnly(p,
		"payout_state_idx", "payout_actionable_idx", "payout_waiting_idx") {
		t.Errorf("a scrape's count of open payouts does not read an index on state:\n%s", p)
	}
	got := series(t, e.reg, "payouts_payment_payouts", "state")
	want := map[string]float64{}
	for _, s := range pc.States {
		want[string(s)] = 0
	}
	want[string(pc.Pending)], want[string(pc.RailAmbiguous)], want[string(pc.Posted)] = 3, 3, history-6
	if !maps.Equal(got, want) {
		t.Fatalf("payouts_payment_payouts = %v, want %v", got, want)
	}
}

// The terminal states are recounted when their count is older than the
// recount period: in between, scrapes report the open states as they are
// and the terminal ones as last counted.
func TestTerminalStatesAreRecountedOncePerPeriod(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.recountEvery(time.Hour)
	e.account(t, "acc-1", 10_000)
	if got := series(t, e.reg, "payouts_payment_payouts", "state"); got[string(pc.Posted)] != 0 || len(got) != len(pc.States) {
		t.Fatalf("first scrape: %v, want every state at 0", got)
	}
	e.payout(t, "po-a", "acc-1", 100)
	e.drive(t, "po-a", pc.Posted, 5, "holder-a")
	e.payout(t, "po-b", "acc-1", 100)
	got := series(t, e.reg, "payouts_payment_payouts", "state")
	if got[string(pc.Pending)] != 1 || got[string(pc.Posted)] != 0 {
		t.Fatalf("scrape within the period: %v, want PENDING 1 (read now) and POSTED 0 (as counted before)", got)
	}
	e.recountEvery(0)
	if got := series(t, e.reg, "payouts_payment_payouts", "state"); got[string(pc.Pending)] != 1 || got[string(pc.Posted)] != 1 {
		t.Fatalf("scrape after the period: %v, want PENDING 1 and POSTED 1", got)
	}
}

// A recount that outlasts the scrape's budget does not hold the scrape:
// it answers with the terminal counts it had (none the first time, which
// counts an error) and the recount's result serves the next scrapes.
func TestSlowRecountDoesNotHoldTheScrape(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	e.payout(t, "po-a", "acc-1", 100)
	e.drive(t, "po-a", pc.Posted, 5, "holder-a")
	release := make(chan struct{})
	hold := func() { <-release }
	e.svc.states.onRecount.Store(&hold)

	start := time.Now()
	got := series(t, e.reg, "payouts_payment_payouts", "state")
	if took := time.Since(start); took > stateQueryTimeout+30*time.Second {
		t.Fatalf("the scrape took %s while the recount was held", took)
	}
	if _, ok := got[string(pc.Posted)]; ok || got[string(pc.Pending)] != 0 || len(got) != len(pc.States)-3 {
		t.Fatalf("first scrape, recount held: %v, want the open states only", got)
	}
	// Counted as a recount, apart from the reads that page.
	if n := series(t, e.reg, "payouts_payment_state_scrape_errors_total", "read"); n["terminal"] < 1 || n["open"] != 0 {
		t.Fatalf("scrape errors %v, want the held first recount counted as read=terminal and no read=open", n)
	}
	close(release)
	// The held recount ends and its count serves the next scrape.
	deadline := time.Now().Add(time.Minute)
	for {
		got = series(t, e.reg, "payouts_payment_payouts", "state")
		if got[string(pc.Posted)] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the recount was released: %v, want POSTED 1", got)
		}
	}

	// Held again with a count in hand: the scrape keeps the old count.
	e.payout(t, "po-b", "acc-1", 100)
	e.drive(t, "po-b", pc.Posted, 6, "holder-a")
	release = make(chan struct{})
	e.recountEvery(0)
	errs := series(t, e.reg, "payouts_payment_state_scrape_errors_total", "read")["terminal"]
	got = series(t, e.reg, "payouts_payment_payouts", "state")
	close(release)
	if got[string(pc.Posted)] != 1 {
		t.Fatalf("scrape while the recount is held: %v, want POSTED 1 as counted before", got)
	}
	if n := series(t, e.reg, "payouts_payment_state_scrape_errors_total", "read")["terminal"]; n != errs {
		t.Fatalf("scrape errors went from %v to %v: a scrape that keeps the previous count is not an error", errs, n)
	}
}

// recountEvery sets how old the terminal counts may be before a scrape has
// them recounted.
func (e *testBundle) recountEvery(d time.Duration) {
	e.svc.states.mu.Lock()
	defer e.svc.states.mu.Unlock()
	e.svc.states.every = d
}

// series gathers reg (as a scrape does) and returns the values of family
// name by the value of label; a failed gather fails the test.
func series(t *testing.T, reg prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var key string
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					key = l.GetValue()
				}
			}
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

// gaugeValue reads the one unlabelled series of a gauge or counter.
func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	got := series(t, reg, name, "")
	v, ok := got[""]
	if !ok || len(got) != 1 {
		t.Fatalf("%s: %v, want one unlabelled series", name, got)
	}
	return v
}
