package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/proctest"
)

// TestReconcileBenchShortRun runs `payouts bench reconcile` on a small load:
// the pass must find nothing (the loader writes what a correct system
// leaves, so a finding means the loader or a check drifted) and report its
// time, memory and every process's CPU.
func TestReconcileBenchShortRun(t *testing.T) {
	t.Parallel() // owns its stack and databases
	bin := proctest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, extra := range [][]string{nil, {"--rail-per-payout"}} {
		args := append([]string{"bench", "reconcile", "--payouts", "230", "--per-grant", "7", "--json", "--dir", filepath.Join(t.TempDir(), "stack")}, extra...)
		cmd := exec.CommandContext(ctx, bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("bench reconcile %v: %v\nstderr:\n%s", extra, err, tail(stderr.String(), 40))
		}
		var res struct {
			Payouts   int                `json:"payouts"`
			Seconds   float64            `json:"seconds"`
			Findings  *int               `json:"findings"`
			PeakRSSMB float64            `json:"peak_rss_mb"`
			Accounts  int                `json:"accounts"`
			ExitCode  int                `json:"exit_code"`
			CPU       map[string]float64 `json:"cpu_s"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
			t.Fatalf("result line %q: %v", stdout.String(), err)
		}
		if res.Payouts != 230 || res.Accounts != 33 || res.Findings == nil || *res.Findings != 0 || res.ExitCode != 0 {
			t.Fatalf("bench reconcile %v: %+v; want 230 payouts over 33 accounts, exit 0, no findings", extra, res)
		}
		// CPU is read in clock ticks (10 ms): a short pass on a quiet
		// machine can cost a server less than one, so each process must be
		// measured, and only the reconciler itself must show work.
		if res.Seconds <= 0 || res.PeakRSSMB <= 0 || res.CPU["reconcile"] <= 0 {
			t.Fatalf("bench reconcile %v: missing measurements: %+v", extra, res)
		}
		for _, p := range []string{"payment", "proxy", "postgres", "lock"} {
			if v, ok := res.CPU[p]; !ok || v < 0 {
				t.Fatalf("bench reconcile %v: no CPU measurement for %s: %+v", extra, p, res)
			}
		}
	}
}
