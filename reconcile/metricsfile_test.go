package reconcile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

// TestMetricsFileIsWrittenDurably: the metrics file is the one channel of
// a pass's safety events once the state file has moved past them, so it
// is written as the state file is: a temporary file synced before it is
// renamed over the file, then the directory synced, so that a crash of the
// host cannot take it back to before the state moved on. It stays
// readable by all (a textfile collector may run as another user), and no
// temporary file is left behind.
func TestMetricsFileIsWrittenDurably(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "payouts_reconcile.prom")
	var (
		mu     sync.Mutex
		synced []string
	)
	defer func(orig func(*os.File) error) { syncFile = orig }(syncFile)
	syncFile = func(f *os.File) error {
		mu.Lock()
		synced = append(synced, f.Name())
		mu.Unlock()
		return f.Sync()
	}
	fm, err := newFileMetrics(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := fm.write(newReport(10), nil, time.Second, time.Now()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(synced) != 2 || filepath.Dir(synced[0]) != dir || !strings.HasPrefix(filepath.Base(synced[0]), ".payouts_reconcile.prom-") || synced[1] != dir {
		t.Fatalf("synced %q; want the file's temporary copy, then its directory %s", synced, dir)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("metrics file mode %v, want 0644", fi.Mode().Perm())
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %v (%v); want only the metrics file", entries, err)
	}
	if fams, err := readMetricsFile(path); err != nil || fams["payouts_reconcile_up"] == nil {
		t.Fatalf("the file does not read back: %v", err)
	}
}
