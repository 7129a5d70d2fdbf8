package reconcile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestMetricsFileCarriesOverRuns: each cron run is a new process writing
// the same textfile. Counters go on from the previous file, and a run
// that cannot complete keeps the last success time and the findings of
// the last completed pass (the staleness alert depends on it).
func TestMetricsFileCarriesOverRuns(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "payouts_reconcile.prom")
	t1 := time.Unix(1_800_000_000, 0)
	run := func(rep *Report, err error, end time.Time) {
		t.Helper()
		fm, ferr := newFileMetrics(path)
		if ferr != nil {
			t.Fatalf("open the metrics file: %v", ferr)
		}
		if werr := fm.write(rep, err, time.Second, end); werr != nil {
			t.Fatal(werr)
		}
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		fams, err := readMetricsFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fam := fams[name]
		if fam == nil {
			t.Fatalf("%s missing from the file", name)
		}
	next:
		for _, m := range fam.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
		t.Fatalf("%s%v missing from the file", name, labels)
		return 0
	}

	// Run 1: completes, resolves two payouts, finds a balance drift.
	rep := newReport(10)
	rep.Resolved = []Resolved{{Resolution: "SETTLED"}, {Resolution: "SETTLED"}}
	rep.add(CheckBalanceDrift, map[string]any{"account_id": "a"}, "drift")
	run(rep, nil, t1)
	// Run 2: cannot run.
	run(nil, errors.New("lock service unreachable"), t1.Add(time.Hour))
	drift := map[string]string{"check": CheckBalanceDrift, "invariant": InvariantOf(CheckBalanceDrift)}
	if got := value("payouts_reconcile_last_success_timestamp_seconds", nil); got != float64(t1.Unix()) {
		t.Fatalf("after a failed run the last success is %v, want the previous run's %d", got, t1.Unix())
	}
	if got := value("payouts_reconcile_up", nil); got != 0 {
		t.Fatalf("up = %v after a failed run", got)
	}
	if got := value("payouts_reconcile_findings", drift); got != 1 {
		t.Fatalf("the failed run dropped the last completed pass's findings: %v", got)
	}
	// Run 3: completes, resolves one more.
	rep = newReport(10)
	rep.Resolved = []Resolved{{Resolution: "SETTLED"}}
	t3 := t1.Add(2 * time.Hour)
	run(rep, nil, t3)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"payouts_reconcile_resolved_total", map[string]string{"resolution": "SETTLED"}, 3},
		{"payouts_reconcile_passes_total", map[string]string{"result": "findings"}, 1},
		{"payouts_reconcile_passes_total", map[string]string{"result": "failed"}, 1},
		{"payouts_reconcile_passes_total", map[string]string{"result": "clean"}, 1},
		{"payouts_reconcile_last_success_timestamp_seconds", nil, float64(t3.Unix())},
		{"payouts_reconcile_findings", drift, 0},
		{"payouts_reconcile_up", nil, 1},
	} {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v after three runs, want %v", c.name, c.labels, got, c.want)
		}
	}
	// A previous file that cannot be parsed is replaced, not fatal.
	if err := os.WriteFile(path, []byte("not { metrics"), 0o600); err != nil {
		t.Fatal(err)
	}
	if fm, err := newFileMetrics(path); err == nil || fm == nil {
		t.Fatalf("a corrupt previous file: %v, %v; want an error to log and a fresh file", fm, err)
	}
}
