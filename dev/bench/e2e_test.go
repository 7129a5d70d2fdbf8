package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m, nil) }

// TestE2EBenchShortRun runs `payouts bench e2e` on a throwaway stack and
// checks the result line: its shape, every payout terminal, nothing paid
// twice at the rail, a CPU figure for every process, the profiles and the
// plot. As root (always under CI) it also limits the payment resources and
// proxies (--role-cpus): each in a control group of its own while the
// bench runs, none left afterwards.
func TestE2EBenchShortRun(t *testing.T) {
	bin := proctest.Binary(t)
	dir := t.TempDir()
	plot := filepath.Join(dir, "run.svg")
	prof := filepath.Join(dir, "profiles")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"bench", "e2e", "--accounts", "10", "--payouts", "100",
		"--executors", "2", "--concurrency", "8", "--replicas", "2", "--json", "--plot", plot, "--profile", prof, "--dir", filepath.Join(dir, "stack")}
	limited := os.Geteuid() == 0 || os.Getenv("CI") == "true"
	if limited {
		// Held to a hundredth of a CPU, a proxy can take seconds to read
		// the rail's answer: with the default 2 s rail timeout it records
		// the payout ambiguous, which is right, but this run wants every
		// payout posted.
		args = append(args, "--role-cpus", "0.01", "--rail-timeout", "60s")
	} else {
		t.Log("not root: --role-cpus is not exercised")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench e2e: %v\nstderr:\n%s", err, tail(stderr.String(), 40))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one JSON line, got %d:\n%s", len(lines), stdout.String())
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(lines[0]), &raw); err != nil {
		t.Fatalf("result is not a JSON object: %v\n%s", err, lines[0])
	}
	for _, k := range []string{"payouts", "accounts", "executors", "payouts_per_sec", "p50_ms", "p99_ms", "duplicates", "cpu_s_per_1000"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("result lacks %q: %s", k, lines[0])
		}
	}
	var res struct {
		Payouts, Accounts, Executors, Duplicates, Posted, Replicas int
		PayoutsPerSec                                              float64            `json:"payouts_per_sec"`
		P50                                                        float64            `json:"p50_ms"`
		P99                                                        float64            `json:"p99_ms"`
		WaitP50                                                    float64            `json:"claim_wait_p50_ms"`
		WaitP99                                                    float64            `json:"claim_wait_p99_ms"`
		PathP50                                                    float64            `json:"path_p50_ms"`
		PathP99                                                    float64            `json:"path_p99_ms"`
		CPU                                                        map[string]float64 `json:"cpu_s_per_1000"`
		RoleCPUs                                                   float64            `json:"role_cpus"`
		Throttled                                                  map[string]float64 `json:"throttled_s"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &res); err != nil {
		t.Fatal(err)
	}
	if res.Payouts != 100 || res.Accounts != 10 || res.Executors != 2 || res.Replicas != 2 {
		t.Errorf("result does not echo the run's shape: %s", lines[0])
	}
	if res.Duplicates != 0 {
		t.Errorf("duplicates at the rail = %d, want 0", res.Duplicates)
	}
	if res.Posted != 100 {
		t.Errorf("posted = %d, want every one of 100", res.Posted)
	}
	if res.PayoutsPerSec <= 0 || res.P50 <= 0 || res.P99 < res.P50 {
		t.Errorf("implausible throughput or latency: %s", lines[0])
	}
	// Every payout was claimed, after it was created and before it ended.
	if res.WaitP50 <= 0 || res.WaitP99 < res.WaitP50 || res.WaitP50 >= res.P50 || res.WaitP99 >= res.P99 {
		t.Errorf("implausible wait to be claimed (p50 %v, p99 %v) against latency (p50 %v, p99 %v): %s", res.WaitP50, res.WaitP99, res.P50, res.P99, lines[0])
	}
	if res.PathP50 <= 0 || res.PathP99 < res.PathP50 || res.PathP50 > res.P50 || res.PathP99 > res.P99 {
		t.Errorf("implausible path from claimed to terminal (p50 %v, p99 %v) against latency (p50 %v, p99 %v): %s", res.PathP50, res.PathP99, res.P50, res.P99, lines[0])
	}
	for _, p := range []string{"bench", "lock", "payment", "payment-2", "proxy", "proxy-2", "rail", "postgres", "executor-1", "executor-2"} {
		if _, ok := res.CPU[p]; !ok {
			t.Errorf("no CPU figure for %s: %v", p, res.CPU)
		}
	}
	for _, p := range []string{"bench.pprof", "payment-000.pprof", "payment-2-000.pprof", "executor-1-000.pprof", "lock-000.pprof"} {
		if st, err := os.Stat(filepath.Join(prof, p)); err != nil || st.Size() == 0 {
			t.Errorf("no CPU profile %s (err %v)", p, err)
		}
	}
	if limited {
		checkRoleLimits(t, stderr.String(), res.RoleCPUs, res.Throttled)
	} else if res.RoleCPUs != 0 || res.Throttled != nil {
		t.Errorf("no --role-cpus, yet the result has role_cpus %v, throttled_s %v", res.RoleCPUs, res.Throttled)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("</svg>")) {
		t.Errorf("plot %s is not an SVG image (err %v)", plot, err)
	}
}

// checkRoleLimits checks a run with --role-cpus 0.01 and replicas 2: every
// payment resource and proxy was put in a control group of its own with
// that limit (the bench logs each), each was held back by it (1 ms of CPU
// in every 100 ms, the kernel's least quota, is less than each needs while
// payouts flow, seconds in all in this run; a process left outside its
// group would show none), and no group is left once the bench has exited.
func checkRoleLimits(t *testing.T, logs string, cpus float64, throttled map[string]float64) {
	t.Helper()
	want := []string{"payment", "payment-2", "proxy", "proxy-2"}
	if cpus != 0.01 {
		t.Errorf("role_cpus = %v, want 0.01", cpus)
	}
	if len(throttled) != len(want) {
		t.Errorf("throttled_s = %v, want a figure for each of %v", throttled, want)
	}
	groups := map[string]string{}
	for _, line := range strings.Split(logs, "\n") {
		var l struct {
			Msg, Process, Cgroup string
			CPUs                 float64
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "role limited" {
			groups[l.Process] = l.Cgroup
			if l.CPUs != 0.01 {
				t.Errorf("%s limited to %v CPUs, want 0.01", l.Process, l.CPUs)
			}
		}
	}
	for _, p := range want {
		if v, ok := throttled[p]; !ok || v <= 0 {
			t.Errorf("throttled_s[%s] = %v (%v): want time held back by the limit", p, v, ok)
		}
		g, ok := groups[p]
		if !ok || !strings.Contains(g, "payouts-bench-") || !strings.HasSuffix(g, "-"+p) {
			t.Errorf("no control group logged for %s: %v", p, groups)
			continue
		}
		if _, err := os.Stat(g); !os.IsNotExist(err) {
			t.Errorf("the control group of %s is left after the bench: %s (%v)", p, g, err)
		}
	}
}

// TestE2EBaselineRiverShortRun runs `payouts bench e2e --baseline river`:
// the baseline first, then payouts, on one stack, in one result line with
// both figures and their ratio; every payout posted by both (the baseline
// checks its own ledger lines and fails otherwise), nothing paid twice.
func TestE2EBaselineRiverShortRun(t *testing.T) {
	bin := proctest.Binary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "e2e", "--baseline", "river", "--baseline-workers", "20", "--rounds", "2",
		"--accounts", "10", "--payouts", "200", "--json", "--dir", filepath.Join(dir, "stack"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench e2e --baseline river: %v\nstderr:\n%s", err, tail(stderr.String(), 40))
	}
	var res struct {
		Baseline                      string
		Payouts, Accounts, Duplicates int
		Posted                        int
		PayoutsPerSec                 float64            `json:"payouts_per_sec"`
		CPU                           map[string]float64 `json:"cpu_s_per_1000"`
		BaselineWorkers               int                `json:"baseline_workers"`
		BaselineRate                  float64            `json:"baseline_payouts_per_sec"`
		BaselineP50                   float64            `json:"baseline_p50_ms"`
		BaselineP99                   float64            `json:"baseline_p99_ms"`
		BaselineDuplicates            int                `json:"baseline_duplicates"`
		BaselineCPU                   map[string]float64 `json:"baseline_cpu_s_per_1000"`
		Ratio                         float64
		Seconds                       float64
		Rounds                        []struct {
			Round         int
			System        string
			PayoutsPerSec float64            `json:"payouts_per_sec"`
			CPU           map[string]float64 `json:"cpu_s_per_1000"`
		}
	}
	line := strings.TrimSpace(stdout.String())
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		t.Fatalf("result is not one JSON object: %v\n%s", err, line)
	}
	// Two rounds of 200 payouts each: the figures pool both.
	if res.Baseline != "river" || res.BaselineWorkers != 20 || res.Payouts != 400 || res.Accounts != 10 {
		t.Errorf("result does not echo the run's shape: %s", line)
	}
	if res.Posted != 400 || res.Duplicates != 0 || res.BaselineDuplicates != 0 {
		t.Errorf("posted %d (want 400), duplicates %d and %d (want 0): %s", res.Posted, res.Duplicates, res.BaselineDuplicates, line)
	}
	var order []string
	for _, rd := range res.Rounds {
		order = append(order, fmt.Sprintf("%d:%s", rd.Round, rd.System))
		if rd.PayoutsPerSec <= 0 {
			t.Errorf("round %d of %s has no rate: %s", rd.Round, rd.System, line)
		}
		if _, ok := rd.CPU["postgres"]; !ok { // per process, as at the top level
			t.Errorf("round %d of %s has no CPU figure for postgres: %s", rd.Round, rd.System, line)
		}
	}
	if got, want := strings.Join(order, " "), "1:river 1:payouts 2:payouts 2:river"; got != want {
		t.Errorf("rounds ran in the order %q, want %q (alternating)", got, want)
	}
	if want := float64(int64(400/res.Seconds*1000+0.5)) / 1000; res.Seconds <= 0 || res.PayoutsPerSec != want {
		t.Errorf("payouts/s %v over %v s: want both rounds' payouts over both rounds' time, %v", res.PayoutsPerSec, res.Seconds, want)
	}
	if res.PayoutsPerSec <= 0 || res.BaselineRate <= 0 || res.BaselineP50 <= 0 || res.BaselineP99 < res.BaselineP50 {
		t.Errorf("implausible throughput or latency: %s", line)
	}
	if want := float64(int64(res.PayoutsPerSec/res.BaselineRate*1000+0.5)) / 1000; res.Ratio != want {
		t.Errorf("ratio %v, want payouts' rate over the baseline's, %v", res.Ratio, want)
	}
	for _, p := range []string{"bench", "rail", "postgres"} {
		if _, ok := res.BaselineCPU[p]; !ok {
			t.Errorf("no baseline CPU figure for %s: %v", p, res.BaselineCPU)
		}
	}
	for _, p := range []string{"payment", "proxy", "lock", "executor-1"} {
		if _, ok := res.BaselineCPU[p]; ok {
			t.Errorf("the baseline counts CPU of %s, which it does not use: %v", p, res.BaselineCPU)
		}
		if _, ok := res.CPU[p]; !ok { // a short run may cost a process less than a clock tick
			t.Errorf("no CPU figure for %s in the payouts run: %v", p, res.CPU)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
