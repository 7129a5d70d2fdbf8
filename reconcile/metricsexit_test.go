package reconcile_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/payouts/payouts/reconcile"
)

// gaugeIn reads an unlabelled gauge of a metrics file.
func gaugeIn(t *testing.T, path, name string) float64 {
	t.Helper()
	fam := families(t, path)[name]
	if fam == nil || len(fam.GetMetric()) != 1 {
		t.Fatalf("%s: %s missing", path, name)
	}
	return fam.GetMetric()[0].GetGauge().GetValue()
}

// families parses a Prometheus text file.
func families(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(fh)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return fams
}

// TestMetricsFileSaysWhatTheExitCodeSays: a --once run that exits 2 leaves
// payouts_reconcile_up at 0 in --metrics-file, whether it failed before
// its pass (a refused token: the file used to keep the previous run's 1;
// a state file in no directory) or after it (a state file that could not
// be saved: the file used to be written before, saying 1 with a fresh
// success time). The last success
// stays the last run that succeeded.
func TestMetricsFileSaysWhatTheExitCodeSays(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	dir := t.TempDir()
	metrics := filepath.Join(dir, "payouts_reconcile.prom")
	run := func(token, stateFile string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		code, err := reconcile.Run(ctx, reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, RailURL: r.RailURL,
			Token: token, RailToken: r.Tokens.Reconciler, Once: true, MetricsFile: metrics, StateFile: stateFile,
			Logger: testLogger(t), Options: reconcile.Options{Owner: "metrics-exit"}})
		t.Logf("exit %d: %v", code, err)
		return code
	}
	if code := run(r.Tokens.Reconciler, filepath.Join(dir, "state.json")); code == reconcile.ExitCannotRun {
		t.Fatal("the first run could not run")
	}
	if up := gaugeIn(t, metrics, "payouts_reconcile_up"); up != 1 {
		t.Fatalf("up = %v after a run that completed", up)
	}
	success := gaugeIn(t, metrics, "payouts_reconcile_last_success_timestamp_seconds")

	if code := run("not-a-token", filepath.Join(dir, "state.json")); code != reconcile.ExitCannotRun {
		t.Fatalf("a refused token: exit %d, want 2", code)
	}
	if up := gaugeIn(t, metrics, "payouts_reconcile_up"); up != 0 {
		t.Errorf("up = %v after a run refused before its pass (exit 2), want 0", up)
	}

	// Its state could not be saved (no such directory): refused before
	// its pass now, which it used to complete first.
	if code := run(r.Tokens.Reconciler, filepath.Join(dir, "gone", "state.json")); code != reconcile.ExitCannotRun {
		t.Fatalf("a state file that cannot be saved: exit %d, want 2", code)
	}
	if up := gaugeIn(t, metrics, "payouts_reconcile_up"); up != 0 {
		t.Errorf("up = %v after a run whose state could not be saved (exit 2), want 0", up)
	}
	if got := gaugeIn(t, metrics, "payouts_reconcile_last_success_timestamp_seconds"); got != success {
		t.Errorf("last success %v after two failed runs, want the first run's %v", got, success)
	}
}

// sampleIn reads the sample of family name whose labels include want from
// a Prometheus text file (-1 when there is none).
func sampleIn(t *testing.T, path, name string, want map[string]string) float64 {
	t.Helper()
	for _, m := range families(t, path)[name].GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if want[l.GetName()] == l.GetValue() {
				match++
			}
		}
		if match == len(want) {
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestSafetyEventsReachTheMetricsFileBeforeTheStateMovesOn: a --once run
// whose metrics file cannot be written (its path is a directory) exits 2
// and leaves its state file as it was, so the next run reports the same
// fenced_out event again, this time in its metrics file, which the alerts
// read. Before, the state moved on first: the event was never reported
// again, and no metrics file ever held it.
func TestSafetyEventsReachTheMetricsFileBeforeTheStateMovesOn(t *testing.T) {
	e := setup(t)
	_, fencedOut := e.staleClaimer(t)
	fencedOut("stale-metrics")
	r := e.st.Ready
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	blocked := filepath.Join(dir, "blocked.prom")
	if err := os.Mkdir(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "payouts_reconcile.prom")
	run := func(metrics string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		code, err := reconcile.Run(ctx, reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, RailURL: r.RailURL,
			Token: r.Tokens.Reconciler, RailToken: r.Tokens.Reconciler, Once: true, MetricsFile: metrics, StateFile: state,
			Logger: testLogger(t), Options: reconcile.Options{Owner: "metrics-order"}})
		t.Logf("exit %d: %v", code, err)
		return code
	}
	if code := run(blocked); code != reconcile.ExitCannotRun {
		t.Fatalf("a metrics file that cannot be written: exit %d, want 2", code)
	}
	if code := run(good); code != reconcile.ExitFindings {
		t.Fatalf("the next run: exit %d, want 1 (the fenced_out event reported again)", code)
	}
	if v := sampleIn(t, good, "payouts_reconcile_findings", map[string]string{"check": reconcile.CheckFencedOut}); v < 1 {
		t.Fatalf("payouts_reconcile_findings{check=fenced_out} = %v in the metrics file; want the event reported", v)
	}
}
