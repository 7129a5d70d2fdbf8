package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
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
	last := 13
	if withChildren {
		last = 15
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

// child is a process of the payouts binary the bench started itself.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// children runs processes of the payouts binary, each logging to
// DIR/logs/NAME.log, and stops them all at the end.
type children struct {
	bin, dir string
	mu       sync.Mutex
	all      []*child
}

func (cs *children) start(name string, args ...string) (*child, error) {
	logPath := filepath.Join(cs.dir, "logs", name+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cs.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(c.done)
	}()
	cs.mu.Lock()
	cs.all = append(cs.all, c)
	cs.mu.Unlock()
	return c, nil
}

// listenAddr waits for a server child to log the address it bound.
func (c *child) listenAddr(ctx context.Context) (string, error) {
	for {
		if addr, err := loggedAddr(c.log, "listening"); err == nil {
			return addr, nil
		}
		select {
		case <-c.done:
			return "", fmt.Errorf("%s exited during start; see %s", c.name, c.log)
		case <-ctx.Done():
			return "", fmt.Errorf("%s never logged its listen address: %w; see %s", c.name, ctx.Err(), c.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// loggedAddr finds the address a process logged with message msg
// ({"msg":msg,"addr":...}) in its log file.
func loggedAddr(path, msg string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg && rec.Addr != "" {
			return rec.Addr, nil
		}
	}
	return "", fmt.Errorf("%s has no %q line", path, msg)
}

// exited reports whether the child has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends every child: SIGTERM, then SIGKILL after grace.
func (cs *children) stop(grace time.Duration) {
	cs.mu.Lock()
	all := cs.all
	cs.all = nil
	cs.mu.Unlock()
	for _, c := range all {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	late := false
	for _, c := range all {
		if !late {
			select {
			case <-c.done:
				continue
			case <-deadline.C:
				late = true
			}
		}
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}
