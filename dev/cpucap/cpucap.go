// Package cpucap gives a process a CPU limit of its own, as a container's
// CPU limit does: a Linux control group with a CPU quota (cgroup v1's cpu
// controller or cgroup v2's cpu.max). The benchmarks use it to show what a
// replica of a role adds when each replica has CPU of its own, on a machine
// where every process otherwise shares the same cores. It needs root (or a
// delegated, writable hierarchy).
package cpucap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// period is the quota's accounting period: the kernel's default.
const period = 100 * time.Millisecond

// Root is where the cgroup file systems are mounted.
var Root = "/sys/fs/cgroup"

// hierarchy is the cgroup tree a Group is made in.
type hierarchy struct {
	dir string // the tree's top directory, where new groups are made
	v2  bool
}

// find returns the hierarchy with a usable CPU controller: cgroup v2 when
// the unified tree is mounted at Root with its cpu controller, else cgroup
// v1's cpu controller.
func find() (hierarchy, error) {
	if ctrl, err := os.ReadFile(filepath.Join(Root, "cgroup.controllers")); err == nil {
		if !hasWord(ctrl, "cpu") {
			return hierarchy{}, fmt.Errorf("cpucap: the cgroup v2 tree at %s offers no cpu controller (cgroup.controllers: %q)", Root, strings.TrimSpace(string(ctrl)))
		}
		return hierarchy{dir: Root, v2: true}, nil
	}
	for _, name := range []string{"cpu", "cpu,cpuacct"} {
		dir := filepath.Join(Root, name)
		if _, err := os.Stat(filepath.Join(dir, "cpu.cfs_quota_us")); err == nil {
			return hierarchy{dir: dir}, nil
		}
	}
	return hierarchy{}, fmt.Errorf("cpucap: no cgroup CPU controller under %s (neither cgroup v2 nor v1's cpu)", Root)
}

func hasWord(b []byte, w string) bool {
	for _, f := range strings.Fields(string(b)) {
		if f == w {
			return true
		}
	}
	return false
}

// Group is one control group with a CPU quota.
type Group struct {
	h   hierarchy
	dir string
}

// New makes the control group name (a single path element) allowing cpus
// CPUs: cpus × 100 ms of CPU time in every 100 ms period, shared by the
// threads of every process added to it.
func New(name string, cpus float64) (*Group, error) {
	if !(cpus > 0) || cpus > 1024 {
		return nil, fmt.Errorf("cpucap: a limit of %v CPUs: it must be above 0 and at most 1024", cpus)
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cpucap: %q is not a group name", name)
	}
	h, err := find()
	if err != nil {
		return nil, err
	}
	if h.v2 {
		// The cpu controller must be enabled for the root's children.
		sub, err := os.ReadFile(filepath.Join(h.dir, "cgroup.subtree_control"))
		if err != nil {
			return nil, fmt.Errorf("cpucap: %w", err)
		}
		if !hasWord(sub, "cpu") {
			if err := write(filepath.Join(h.dir, "cgroup.subtree_control"), "+cpu"); err != nil {
				return nil, err
			}
		}
	}
	g := &Group{h: h, dir: filepath.Join(h.dir, name)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cpucap: make the group: %w", err)
	}
	quota := int64(cpus * float64(period/time.Microsecond))
	quota = max(quota, 1000) // the kernel's least quota is 1 ms
	var werr error
	if h.v2 {
		werr = write(filepath.Join(g.dir, "cpu.max"), fmt.Sprintf("%d %d", quota, period/time.Microsecond))
	} else if werr = write(filepath.Join(g.dir, "cpu.cfs_period_us"), strconv.FormatInt(int64(period/time.Microsecond), 10)); werr == nil {
		werr = write(filepath.Join(g.dir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
	}
	if werr != nil {
		_ = os.Remove(g.dir)
		return nil, werr
	}
	return g, nil
}

// Dir is the group's directory.
func (g *Group) Dir() string { return g.dir }

// Add moves the process pid, with all its threads, into the group. Threads
// it starts later are in the group too.
func (g *Group) Add(pid int) error {
	return write(filepath.Join(g.dir, "cgroup.procs"), strconv.Itoa(pid))
}

// Pids lists the processes in the group.
func (g *Group) Pids() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("cpucap: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cpucap: %s/cgroup.procs: %q", g.dir, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Stat is what the kernel counted for the group.
type Stat struct {
	// Periods is the accounting periods in which the group's processes
	// ran, and Throttled those in which they used up the quota and were
	// held back until the period ended.
	Periods, Throttled int64
	// ThrottledTime is how long they were held back in all.
	ThrottledTime time.Duration
}

// Stat reads the group's cpu.stat.
func (g *Group) Stat() (Stat, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		return Stat{}, fmt.Errorf("cpucap: %w", err)
	}
	var s Stat
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "nr_periods":
			s.Periods = n
		case "nr_throttled":
			s.Throttled = n
		case "throttled_time": // v1, nanoseconds
			s.ThrottledTime = time.Duration(n)
		case "throttled_usec": // v2
			s.ThrottledTime = time.Duration(n) * time.Microsecond
		}
	}
	return s, nil
}

// Remove moves any process still in the group back to the top of the
// hierarchy and removes the group.
func (g *Group) Remove() error {
	pids, err := g.Pids()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, pid := range pids {
		// A process that has exited meanwhile cannot be moved: ESRCH.
		if err := write(filepath.Join(g.h.dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil && !processGone(pid) {
			return err
		}
	}
	// The kernel takes an exited process out of the group at once, but a
	// zombie not yet reaped stays counted: the caller reaps its children
	// before Remove.
	if err := os.Remove(g.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cpucap: remove the group: %w", err)
	}
	return nil
}

func processGone(pid int) bool {
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
	return errors.Is(err, os.ErrNotExist)
}

func write(path, s string) error {
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return fmt.Errorf("cpucap: write %q to %s: %w", s, path, err)
	}
	return nil
}
