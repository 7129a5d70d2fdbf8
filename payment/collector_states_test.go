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
	if _, err := e.recon.Resolve(tctx(t), "po-f", 9, "holder-r", pc.ResolutionAbsent, "rail: no payment for the reference"); err != nil {
		t.Fatal(err)
	}
	check(map[pc.State]float64{pc.Pending: 2, pc.Claimed: 1, pc.Posted: 1, pc.Failed: 2, pc.RailAmbiguous: 1})
	if age := gaugeValue(t, e.reg, "payouts_payment_oldest_ambiguous_age_seconds"); age < 3600 || age > 3600+600 {
		t.Fatalf("oldest ambiguous age %.0fs after the older was resolved, want about 1h", age)
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
	if n := gaugeValue(t, e.reg, "payouts_payment_state_scrape_errors_total"); n != 2 {
		t.Fatalf("scrape errors %v after two scrapes, want 2", n)
	}
	if n := gaugeValue(t, e.reg, "payouts_payment_resolution_sla_seconds"); n <= 0 {
		t.Fatalf("resolution SLA gauge %v", n)
	}
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
