package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/faultproxy"
)

// The faults of a chaos run. Every fault is drawn from the run's seeded RNG
// and recorded in the fault timeline.

// chaosFault is one entry of the fault timeline (written as JSON).
type chaosFault struct {
	Seq       int    `json:"seq"`
	AtMS      int64  `json:"at_ms"` // since the chaos began
	Kind      string `json:"kind"`
	Target    string `json:"target"`
	Detail    string `json:"detail,omitempty"`
	EndedAtMS int64  `json:"ended_at_ms,omitempty"` // heal, thaw, member back, server up again
}

// Fault kinds. Partitions are one kind per link and mode, so that the
// first round (every kind once) covers each of them.
var chaosPartitionLinks = []string{"exec-lock", "exec-payment", "exec-proxy", "proxy-rail"}
var chaosPartitionModes = []faultproxy.Mode{faultproxy.Blackhole, faultproxy.Reset, faultproxy.Delay}

func chaosKinds(backend string) []string {
	kinds := []string{"executor_sigkill", "executor_sigstop", "stale_writer_sigstop", "lock_sigterm", "lock_sigkill", "payment_sigterm",
		"payment_sigkill", "proxy_sigterm", "proxy_sigkill", "postgres_crash"}
	if backend == "etcd" {
		kinds = append(kinds, "etcd_leader_loss", "etcd_follower_loss")
	}
	for _, l := range chaosPartitionLinks {
		for _, m := range chaosPartitionModes {
			kinds = append(kinds, "partition_"+l+"_"+m.String())
		}
	}
	return kinds
}

// partition is a link in a fault mode until healAt.
type partition struct {
	link   *faultproxy.Link
	mode   faultproxy.Mode
	healAt time.Time
	fault  int              // index in the timeline
	before faultproxy.Stats // the link's counts when it was cut
}

// waitStopped waits, ten seconds at most, until process pid is stopped
// (state T): a freeze that did not happen would prove nothing.
func waitStopped(t *testing.T, pid int, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatalf("read the state of %s: %v", name, err)
		}
		// pid (comm) state ...: the state follows the last ')'.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(stat[i+1:])), "T") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) was sent SIGSTOP but is not stopped: %s", name, pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// chaos injects cfg.faults faults, spread over cfg.duration with seeded
// jitter: first every kind once in a seeded order, then kinds at random.
func (c *chaosRun) chaos() {
	kinds := chaosKinds(c.backend)
	plan := append([]string(nil), kinds...)
	c.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	// The random draws favour the stale writer a little: between two of
	// its freezes it keeps the accounts it holds.
	pool := append(append([]string(nil), kinds...), "stale_writer_sigstop", "stale_writer_sigstop")
	deferred := map[string]int{}
	every := c.cfg.duration / time.Duration(c.cfg.faults+1)
	next := c.chaosStart
	for n := 0; n < c.cfg.faults; n++ {
		jitter := time.Duration(c.rng.Int64N(int64(every))) - every/2
		next = next.Add(every)
		// Pacing of the schedule, not synchronisation: the faults are
		// spread over the run while the workload flows.
		for time.Now().Before(next.Add(jitter)) {
			c.settleDue(false)
			time.Sleep(100 * time.Millisecond)
		}
		c.settleDue(false)
		c.checkProcesses()
		var kind string
		fromPlan := len(plan) > 0
		if fromPlan {
			kind, plan = plan[0], plan[1:]
		} else {
			kind = pool[c.rng.IntN(len(pool))]
		}
		if !c.do(kind) {
			// Not applicable now (e.g. one executor left working, an etcd
			// member already down): a planned kind goes to the back of the
			// plan (a few times at most), and another is drawn.
			n--
			if deferred[kind]++; fromPlan && deferred[kind] <= 5 {
				plan = append(plan, kind)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func (c *chaosRun) since() int64 { return time.Since(c.chaosStart).Milliseconds() }

func (c *chaosRun) record(kind, target, detail string) int {
	c.timeline = append(c.timeline, chaosFault{Seq: len(c.timeline) + 1, AtMS: c.since(), Kind: kind, Target: target, Detail: detail})
	c.t.Logf("chaos %d: %s %s %s", len(c.timeline), kind, target, detail)
	return len(c.timeline) - 1
}

func (c *chaosRun) ended(i int) { c.timeline[i].EndedAtMS = c.since() }

// do injects one fault of kind; false when it does not apply right now.
func (c *chaosRun) do(kind string) bool {
	t := c.t
	switch {
	case kind == "executor_sigkill":
		e := c.pick()
		if e == nil {
			return false
		}
		c.record(kind, e.p.Name, "")
		e.killedByUs = true
		e.p.Kill()
		for _, l := range e.links {
			c.heal(l)
			_ = l.Close()
		}
		c.startExecutor()
	case kind == "executor_sigstop", kind == "stale_writer_sigstop":
		e := c.pick()
		if kind == "stale_writer_sigstop" {
			e = c.stale
		}
		if e == nil || e.paused {
			return false
		}
		// Frozen past its session TTL: a successor takes its accounts, and
		// when thawed its writes must be fenced.
		hold := chaosTTL + time.Duration(1000+c.rng.IntN(3000))*time.Millisecond
		c.pauses[e] = c.record(kind, e.p.Name, "for "+hold.String())
		if err := e.p.Pause(); err != nil {
			t.Fatalf("pause %s: %v", e.p.Name, err)
		}
		waitStopped(t, e.p.Pid(), e.p.Name)
		e.paused, e.resumeAt = true, time.Now().Add(hold)
	case strings.HasPrefix(kind, "lock_"), strings.HasPrefix(kind, "payment_"), strings.HasPrefix(kind, "proxy_"):
		role, sig, _ := strings.Cut(kind, "_")
		sv := c.payment
		switch role {
		case "lock":
			sv = c.locks[c.rng.IntN(len(c.locks))]
		case "proxy":
			sv = c.proxy
		}
		i := c.record(kind, sv.p.Name, "")
		sv.stop(t, sig == "sigkill")
		sv.start(t, c.authFile())
		c.ended(i)
	case kind == "postgres_crash":
		down := time.Duration(200+c.rng.IntN(2000)) * time.Millisecond
		i := c.record(kind, "postgres", "pg_ctl stop -m immediate, down "+down.String())
		if err := c.s.st.PG().Crash(); err != nil {
			t.Fatalf("crash PostgreSQL: %v", err)
		}
		time.Sleep(down) // the outage itself
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.s.st.PG().Start(ctx); err != nil {
			t.Fatalf("start PostgreSQL after the crash: %v", err)
		}
		c.ended(i)
	case kind == "etcd_leader_loss", kind == "etcd_follower_loss":
		if c.etcdDown != nil {
			return false // one member down at a time: the cluster keeps its quorum
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		leader, err := c.s.st.Etcd().Leader(ctx)
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		victim := leader
		if kind == "etcd_follower_loss" {
			victim = nil
			for _, n := range c.s.st.Etcd().Nodes {
				if n != leader && n.Running() {
					victim = n
					break
				}
			}
			if victim == nil {
				return false
			}
		}
		back := time.Duration(2000+c.rng.IntN(4000)) * time.Millisecond
		c.etcdFault = c.record(kind, victim.Name, "down "+back.String())
		victim.Stop()
		c.etcdDown, c.etcdBackAt = victim, time.Now().Add(back)
	case strings.HasPrefix(kind, "partition_"):
		return c.partition(kind)
	default:
		t.Fatalf("unknown fault kind %q", kind)
	}
	c.counts[kind]++
	return true
}

// partition puts one link into a fault mode for a seeded while.
func (c *chaosRun) partition(kind string) bool {
	rest := strings.TrimPrefix(kind, "partition_")
	cut := strings.LastIndex(rest, "_")
	which, modeName := rest[:cut], rest[cut+1:]
	mode, err := faultproxy.ParseMode(modeName)
	if err != nil {
		c.t.Fatal(err)
	}
	var link *faultproxy.Link
	if which == "proxy-rail" {
		link = c.railLink
	} else {
		e := c.pick()
		if e == nil {
			return false
		}
		link = e.links[strings.TrimPrefix(which, "exec-")]
	}
	if _, busy := c.partitions[link]; busy {
		return false
	}
	var delay time.Duration
	if mode == faultproxy.Delay {
		delay = time.Duration(50+c.rng.IntN(700)) * time.Millisecond
	}
	hold := time.Duration(1000+c.rng.IntN(5000)) * time.Millisecond
	detail := fmt.Sprintf("%s for %s", mode, hold)
	if delay > 0 {
		detail = fmt.Sprintf("%s %s for %s", mode, delay, hold)
	}
	i := c.record(kind, link.Name, detail)
	before := link.Stats()
	if err := link.Set(mode, delay); err != nil {
		c.t.Fatal(err)
	}
	c.partitions[link] = partition{link: link, mode: mode, healAt: time.Now().Add(hold), fault: i, before: before}
	c.counts[kind]++
	return true
}

func (c *chaosRun) heal(l *faultproxy.Link) {
	p, ok := c.partitions[l]
	if !ok {
		return
	}
	if err := l.Set(faultproxy.Pass, 0); err != nil {
		c.t.Fatal(err)
	}
	if p.mode != faultproxy.Delay {
		after := l.Stats()
		c.cut += after.Reset - p.before.Reset + after.Swallow - p.before.Swallow
	}
	c.ended(p.fault)
	delete(c.partitions, l)
}

// settleDue ends the faults whose time has come (every one, when all):
// thaws frozen executors, heals links, brings the stopped etcd member back.
func (c *chaosRun) settleDue(all bool) {
	now := time.Now()
	for _, e := range append([]*chaosExec{c.stale}, c.execs...) {
		if e.paused && (all || now.After(e.resumeAt)) {
			if err := e.p.Resume(); err != nil {
				c.t.Fatalf("resume %s: %v", e.p.Name, err)
			}
			e.paused = false
			c.ended(c.pauses[e])
		}
	}
	for l, p := range c.partitions {
		if all || now.After(p.healAt) {
			c.heal(l)
		}
	}
	if c.etcdDown != nil && (all || now.After(c.etcdBackAt)) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.etcdDown.Restart(ctx); err != nil {
			c.t.Fatalf("restart etcd member %s: %v", c.etcdDown.Name, err)
		}
		c.ended(c.etcdFault)
		c.etcdDown = nil
	}
}

// calm ends the chaos: every frozen executor thawed, every link healed,
// every etcd member up with a leader, the stale writer stopped (SIGTERM:
// its held work carries on under the grant check, and it exits cleanly).
func (c *chaosRun) calm() {
	c.settleDue(true)
	if err := c.stale.p.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatalf("SIGTERM the stale writer: %v", err)
	}
	if code, err := c.stale.p.Wait(2 * time.Minute); err != nil || code != 0 {
		c.t.Errorf("the stale writer after SIGTERM: exit %d, %v\n%s", code, err, tailLines(c.stale.p.Log(), 30))
	}
	c.stale.exitChecked = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.s.st.Etcd().Leader(ctx); err != nil {
		c.t.Fatal(err)
	}
	c.checkProcesses()
}

// writeJSON writes v to path, indented.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
