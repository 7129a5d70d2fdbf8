package cpucap

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newGroup makes a group for a test and removes it at the end. Under
// CI=true (.ci/run runs as root on Linux) a machine without a writable CPU
// controller is a failure; elsewhere the test is skipped, saying why.
func newGroup(t *testing.T, cpus float64) *Group {
	t.Helper()
	g, err := New(fmt.Sprintf("payouts-cpucap-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")), cpus)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no writable cgroup CPU controller under CI (root on Linux): %v", err)
		}
		t.Skipf("skipped: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Remove(); err != nil {
			t.Errorf("remove the group: %v", err)
		}
	})
	return g
}

// spinner starts a shell that waits for a line on its stdin, then spins
// on one CPU until killed. The returned function starts the spin.
func spinner(t *testing.T) (*exec.Cmd, func()) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read x; while :; do :; done")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, func() {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
}

func inGroup(t *testing.T, pid int, g *Group) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), "/"+filepath.Base(g.Dir())+"\n")
}

// TestQuotaHoldsAProcessToItsCPUs: a process spinning in a group of 0.2 CPU
// gets at most 0.2 s of CPU per second and is throttled in most periods;
// without the group it would take a whole CPU.
func TestQuotaHoldsAProcessToItsCPUs(t *testing.T) {
	const cpus = 0.2
	g := newGroup(t, cpus)
	cmd, spin := spinner(t)
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if !inGroup(t, cmd.Process.Pid, g) {
		t.Fatalf("pid %d is not in %s", cmd.Process.Pid, g.Dir())
	}
	pids, err := g.Pids()
	if err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("Pids = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	start := time.Now()
	spin()
	// Ten throttled periods: the spinner used up its quota ten times. An
	// unlimited process is never throttled, so this wait would time out.
	deadline := start.Add(2 * time.Minute)
	var st Stat
	for st.Throttled < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("after %v the group was throttled in %d periods, not 10: the quota does not hold (%+v)", time.Since(start), st.Throttled, st)
		}
		time.Sleep(20 * time.Millisecond)
		if st, err = g.Stat(); err != nil {
			t.Fatal(err)
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	wall := time.Since(start)
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	// The quota is cpus × each 100 ms period; two periods of slack for the
	// ends of the measurement and the shell's start.
	if limit := time.Duration(cpus*float64(wall)) + 2*time.Duration(cpus*float64(period)) + 10*time.Millisecond; used > limit {
		t.Fatalf("the spinner used %v of CPU in %v: more than %v CPUs allow (%v)", used, wall, cpus, limit)
	}
	if st.ThrottledTime <= 0 || st.Periods < st.Throttled {
		t.Fatalf("cpu.stat = %+v: want throttled time and periods", st)
	}
	t.Logf("%v of CPU in %v, %d of %d periods throttled", used, wall, st.Throttled, st.Periods)
}

// TestRemoveMovesLiveProcessesOut: a group still holding a live process is
// removed, and the process goes on, outside it.
func TestRemoveMovesLiveProcessesOut(t *testing.T) {
	g := newGroup(t, 0.5) // its cleanup removes it a second time
	cmd, _ := spinner(t)  // waits on its stdin: alive, idle
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Remove(); err != nil {
		t.Fatalf("Remove with a live process: %v", err)
	}
	if _, err := os.Stat(g.Dir()); !os.IsNotExist(err) {
		t.Fatalf("%s is still there (%v)", g.Dir(), err)
	}
	if inGroup(t, cmd.Process.Pid, g) {
		t.Fatalf("pid %d is still in the removed group", cmd.Process.Pid)
	}
}

func TestNewRefusesBadLimitsAndNames(t *testing.T) {
	for _, c := range []struct {
		name string
		cpus float64
	}{{"x", 0}, {"x", -1}, {"x", 2000}, {"", 1}, {"a/b", 1}, {"..", 1}} {
		if g, err := New(c.name, c.cpus); err == nil {
			_ = g.Remove()
			t.Errorf("New(%q, %v) = nil error", c.name, c.cpus)
		}
	}
}

// TestFindReadsBothLayouts: a v2 tree is recognised by its
// cgroup.controllers, and refused without the cpu controller; a v1 tree by
// its cpu controller's quota file.
func TestFindReadsBothLayouts(t *testing.T) {
	old := Root
	t.Cleanup(func() { Root = old })
	mk := func(files map[string]string) string {
		dir := t.TempDir()
		for name, body := range files {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	Root = mk(map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"})
	if h, err := find(); err != nil || !h.v2 || h.dir != Root {
		t.Fatalf("v2: %+v, %v", h, err)
	}
	Root = mk(map[string]string{"cgroup.controllers": "memory pids\n"})
	if _, err := find(); err == nil || !strings.Contains(err.Error(), "no cpu controller") {
		t.Fatalf("v2 without cpu: %v", err)
	}
	Root = mk(map[string]string{"cpu,cpuacct/cpu.cfs_quota_us": "-1\n"})
	if h, err := find(); err != nil || h.v2 || h.dir != filepath.Join(Root, "cpu,cpuacct") {
		t.Fatalf("v1: %+v, %v", h, err)
	}
	Root = mk(map[string]string{"memory/memory.limit_in_bytes": "1\n"})
	if _, err := find(); err == nil {
		t.Fatal("no cpu controller: want an error")
	}
}

// TestNewWritesTheQuota: what New writes to each layout, on a fake tree:
// v2 enables the cpu controller for the root's children and writes
// cpu.max; v1 writes the period and the quota.
func TestNewWritesTheQuota(t *testing.T) {
	old := Root
	t.Cleanup(func() { Root = old })
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	Root = t.TempDir()
	for name, body := range map[string]string{"cgroup.controllers": "cpu memory\n", "cgroup.subtree_control": "memory\n"} {
		if err := os.WriteFile(filepath.Join(Root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g, err := New("g2", 0.25)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(filepath.Join(Root, "cgroup.subtree_control")); got != "+cpu" {
		t.Errorf("v2 subtree_control = %q, want +cpu written", got)
	}
	if got := read(filepath.Join(g.Dir(), "cpu.max")); got != "25000 100000" {
		t.Errorf("v2 cpu.max = %q", got)
	}
	if err := g.Add(4242); err != nil || read(filepath.Join(g.Dir(), "cgroup.procs")) != "4242" {
		t.Errorf("v2 Add: %v", err)
	}
	if err := os.WriteFile(filepath.Join(g.Dir(), "cpu.stat"), []byte("usage_usec 9\nnr_periods 40\nnr_throttled 30\nthrottled_usec 1500000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := g.Stat(); err != nil || st != (Stat{Periods: 40, Throttled: 30, ThrottledTime: 1500 * time.Millisecond}) {
		t.Errorf("v2 Stat = %+v, %v", st, err)
	}

	Root = t.TempDir()
	if err := os.MkdirAll(filepath.Join(Root, "cpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(Root, "cpu", "cpu.cfs_quota_us"), []byte("-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err = New("g1", 1.5)
	if err != nil {
		t.Fatal(err)
	}
	if g.Dir() != filepath.Join(Root, "cpu", "g1") {
		t.Errorf("v1 dir = %s", g.Dir())
	}
	if p, q := read(filepath.Join(g.Dir(), "cpu.cfs_period_us")), read(filepath.Join(g.Dir(), "cpu.cfs_quota_us")); p != "100000" || q != "150000" {
		t.Errorf("v1 period, quota = %q, %q", p, q)
	}
	if err := os.WriteFile(filepath.Join(g.Dir(), "cpu.stat"), []byte("nr_periods 7\nnr_throttled 5\nthrottled_time 2000000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := g.Stat(); err != nil || st != (Stat{Periods: 7, Throttled: 5, ThrottledTime: 2 * time.Second}) {
		t.Errorf("v1 Stat = %+v, %v", st, err)
	}
}
