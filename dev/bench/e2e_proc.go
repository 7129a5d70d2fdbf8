package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/payouts/payouts/dev/supervise"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat. It
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU reads a process's CPU time (user + system) from /proc/PID/stat.
// withChildren adds the CPU of its children that have exited and been
// waited for (cutime + cstime): a PostgreSQL backend that ended during
// the run is counted in its postmaster.
func procCPU(pid int, withChildren bool) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime 15, cutime 16, cstime 17.
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// f[11] is utime (field 14), f[12] stime, f[13] cutime, f[14] cstime.
	last := 12
	if withChildren {
		last = 14
	}
	var ticks int64
	for k := 11; k <= last; k++ {
		n, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat field %d: %w", pid, k+3, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// procParent is the parent pid of pid (field 4 of /proc/PID/stat).
func procParent(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if i < 0 || len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return strconv.Atoi(f[1])
}

// treeCPU is the CPU time of pid, of its children that have exited, and of
// its live children: the whole of a PostgreSQL cluster when pid is the
// postmaster.
func treeCPU(pid int) (time.Duration, error) {
	total, err := procCPU(pid, true)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if pp, err := procParent(child); err == nil && pp == pid {
			if c, err := procCPU(child, false); err == nil {
				total += c
			}
		}
	}
	return total, nil
}

// cpuMeter snapshots the CPU time of named processes before and after a run.
type cpuMeter struct {
	pids   map[string]int
	tree   map[string]bool
	before map[string]time.Duration
}

func newCPUMeter() *cpuMeter {
	return &cpuMeter{pids: map[string]int{}, tree: map[string]bool{}, before: map[string]time.Duration{}}
}

// add watches pid under name; tree counts its children too.
func (m *cpuMeter) add(name string, pid int, tree bool) {
	m.pids[name], m.tree[name] = pid, tree
}

func (m *cpuMeter) read(name string) (time.Duration, error) {
	if m.tree[name] {
		return treeCPU(m.pids[name])
	}
	return procCPU(m.pids[name], false)
}

// start records every process's CPU time so far.
func (m *cpuMeter) start() error {
	for name := range m.pids {
		d, err := m.read(name)
		if err != nil {
			return fmt.Errorf("cpu of %s (pid %d): %w", name, m.pids[name], err)
		}
		m.before[name] = d
	}
	return nil
}

// since is each process's CPU time since start.
func (m *cpuMeter) since() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for name := range m.pids {
		d, err := m.read(name)
		if err != nil {
			return nil, fmt.Errorf("cpu of %s (pid %d): %w", name, m.pids[name], err)
		}
		out[name] = d - m.before[name]
	}
	return out, nil
}

// children runs processes of the payouts binary under the one supervisor
// of child processes, each logging to DIR/logs/NAME.log, and stops them
// all at the end.
type children struct {
	bin, dir string
	mu       sync.Mutex
	all      []*supervise.Proc
}

// start runs a child with extra environment env.
func (cs *children) start(name string, env []string, args ...string) (*supervise.Proc, error) {
	return cs.spawn(supervise.Spec{Name: name, Env: env, Args: args})
}

// startServer runs a server child, which reports the address it binds
// through DIR/run/NAME.addr.
func (cs *children) startServer(name string, args ...string) (*supervise.Proc, error) {
	return cs.spawn(supervise.Spec{Name: name, Args: args, AddrFile: filepath.Join(cs.dir, "run", name+".addr")})
}

func (cs *children) spawn(spec supervise.Spec) (*supervise.Proc, error) {
	spec.Path, spec.Log = cs.bin, filepath.Join(cs.dir, "logs", spec.Name+".log")
	for _, f := range []string{spec.Log, spec.AddrFile} {
		if f == "" {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return nil, err
		}
	}
	c, err := supervise.Start(spec)
	if err != nil {
		return nil, err
	}
	cs.mu.Lock()
	cs.all = append(cs.all, c)
	cs.mu.Unlock()
	return c, nil
}

// stop ends every child: SIGTERM, then SIGKILL after grace.
func (cs *children) stop(grace time.Duration) {
	cs.mu.Lock()
	all := cs.all
	cs.all = nil
	cs.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Add(1)
		go func() { defer wg.Done(); c.Stop(grace) }()
	}
	wg.Wait()
}
