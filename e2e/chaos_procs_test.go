package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/faultproxy"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/executor"
)

// The processes of a chaos run: every server role but the rail stub runs
// as the test's own child so that it can be signalled, and every link the
// run partitions goes through a fault proxy link.

// chaosService is one server process, restarted on the same address.
type chaosService struct {
	role string   // lock, payment, proxy
	name string   // lock-a, payment, ...
	addr string   // host:port; "127.0.0.1:0" until the first start
	args []string // serve ... without --listen
	gen  int
	p    *proctest.Proc
}

func (sv *chaosService) url() string { return "http://" + sv.addr }

// start runs the service (again) on its address and waits until it is ready.
func (sv *chaosService) start(t *testing.T, authFile string) {
	t.Helper()
	sv.gen++
	name := fmt.Sprintf("%s-%d", sv.name, sv.gen)
	args := append(append([]string(nil), sv.args...), "--listen", sv.addr, "--auth-file", authFile)
	sv.p = proctest.Start(t, name, nil, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if strings.HasSuffix(sv.addr, ":0") {
		addr, err := listenAddr(ctx, sv.p)
		if err != nil {
			t.Fatal(err)
		}
		sv.addr = addr
	}
	if err := proctest.WaitReady(ctx, sv.url()); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, tailLines(sv.p.Log(), 30))
	}
}

// listenAddr waits for the address a server logs once it is bound.
func listenAddr(ctx context.Context, p *proctest.Proc) (string, error) {
	for {
		for _, m := range logLines(p.Log(), "listening") {
			if a, _ := m["addr"].(string); a != "" {
				return a, nil
			}
		}
		if p.Exited() {
			return "", fmt.Errorf("%s exited before listening:\n%s", p.Name, tailLines(p.Log(), 30))
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s never logged its listen address: %w", p.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends the service: SIGKILL, or SIGTERM and a clean exit 0.
func (sv *chaosService) stop(t *testing.T, kill bool) {
	t.Helper()
	if kill {
		sv.p.Kill()
		return
	}
	if err := sv.p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", sv.p.Name, err)
	}
	if code, err := sv.p.Wait(2 * time.Minute); err != nil || code != 0 {
		t.Fatalf("%s after SIGTERM: exit %d, %v\n%s", sv.p.Name, code, err, tailLines(sv.p.Log(), 30))
	}
}

// chaosServices starts the run's own lock replicas, payment resource and
// rail proxy in place of the stack's (the first lock replica, the payment
// resource and the proxy keep the stack's addresses, so the shared helpers
// and the reconciler find them). The proxy reaches the rail through a
// fault proxy link.
func (c *chaosRun) startServices() {
	t, r := c.t, c.s.st.Ready
	for _, role := range []string{"lock", "payment", "proxy"} {
		c.s.st.StopRole(role, 20*time.Second)
	}
	var lockArgs []string
	switch c.backend {
	case "etcd":
		lockArgs = []string{"serve", "lock", "--backend", "etcd", "--etcd-endpoints", strings.Join(r.Etcd, ",")}
	case "postgres":
		lockArgs = []string{"serve", "lock", "--backend", "postgres", "--database-url", r.DatabaseURLs.LockDB}
	default:
		t.Fatalf("unknown lock backend %q", c.backend)
	}
	c.locks = []*chaosService{
		{role: "lock", name: "lock-a", addr: hostPort(t, r.LockURL), args: lockArgs},
		{role: "lock", name: "lock-b", addr: "127.0.0.1:0", args: lockArgs},
	}
	var err error
	if c.railLink, err = c.fp.Link("proxy-rail", hostPort(t, r.RailURL)); err != nil {
		t.Fatal(err)
	}
	c.payment = &chaosService{role: "payment", name: "payment", addr: hostPort(t, r.PaymentURL),
		args: []string{"serve", "payment", "--database-url", c.s.st.ServingDatabaseURLs().PayDB}}
	c.proxy = &chaosService{role: "proxy", name: "proxy", addr: hostPort(t, r.ProxyURL),
		args: []string{"serve", "proxy", "--database-url", c.s.st.ServingDatabaseURLs().ProxyDB, "--rail-url", c.railLink.URL("http"),
			"--rail-token", r.Tokens.Proxy, "--rail-timeout", chaosRailTimeout.String()}}
	for _, sv := range c.services() {
		sv.start(t, c.authFile())
	}
}

func (c *chaosRun) authFile() string { return filepath.Join(c.s.st.Ready.Dir, "auth.json") }

func (c *chaosRun) services() []*chaosService {
	return append(append([]*chaosService(nil), c.locks...), c.payment, c.proxy)
}

// chaosExec is one executor and its own links to the lock service, the
// payment resource and the proxy.
type chaosExec struct {
	p           *proctest.Proc
	links       map[string]*faultproxy.Link // lock, payment, proxy
	paused      bool
	resumeAt    time.Time
	killedByUs  bool
	exitChecked bool
}

// startExecutor runs one more executor; executors alternate between the
// lock replicas.
func (c *chaosRun) startExecutor() {
	c.started++
	e := c.spawnExecutor(fmt.Sprintf("exec-%d", c.started), c.cfg.concurrency)
	c.execs = append(c.execs, e)
}

// startStaleWriter runs the stale writer: an executor whose test hook holds
// each grant's work after RAIL_SUBMITTED until its grant is lost, then
// calls the proxy and reports WITHOUT its client-side grant check — a
// process paused between its check and its write (UC-03). The chaos
// freezes it past its session TTL from time to time; its late writes must
// be fenced out by the guards.
func (c *chaosRun) startStaleWriter() {
	c.stale = c.spawnExecutor("stale-writer", 2, executor.HoldAfterEnv+"="+string(executor.AfterSubmitting))
}

func (c *chaosRun) spawnExecutor(name string, concurrency int, env ...string) *chaosExec {
	t, r := c.t, c.s.st.Ready
	e := &chaosExec{links: map[string]*faultproxy.Link{}}
	for _, to := range []struct{ link, target string }{
		{"lock", c.locks[len(c.execs)%len(c.locks)].addr}, {"payment", c.payment.addr}, {"proxy", c.proxy.addr},
	} {
		l, err := c.fp.Link(name+"-"+to.link, to.target)
		if err != nil {
			t.Fatal(err)
		}
		e.links[to.link] = l
	}
	args := []string{"run", "executor", "--owner", name, "--lock-url", e.links["lock"].URL("http"),
		"--payment-url", e.links["payment"].URL("http"), "--proxy-url", e.links["proxy"].URL("http"),
		"--session-ttl", executorTTL, "--poll-interval", "200ms", "--call-timeout", "5s",
		"--concurrency", fmt.Sprint(concurrency)}
	e.p = proctest.Start(t, name, append(env, "PAYOUTS_TOKEN="+r.Tokens.Executor), args...)
	return e
}

// pick chooses a running, unfrozen executor; nil when only one is left
// working (the run keeps one).
func (c *chaosRun) pick() *chaosExec {
	var live []*chaosExec
	for _, e := range c.execs {
		if !e.paused && !e.p.Exited() {
			live = append(live, e)
		}
	}
	if len(live) <= 1 {
		return nil
	}
	return live[c.rng.IntN(len(live))]
}

// startReconciler runs `payouts reconcile --once` every few seconds while
// the chaos runs, as cron would: each pass resolves the ambiguous payouts
// whose settlement window has passed and ends its lock session on exit.
// A pass that cannot run (exit 2) is expected while a store is down.
func (c *chaosRun) startReconciler() {
	r := c.s.st.Ready
	bin := proctest.Binary(c.t)
	args := []string{"reconcile", "--once", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL,
		"--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["reconciler"], "--settlement-window", chaosSettleWindow.String(),
		"--owner", "chaos-reconciler", "--request-timeout", "10s"}
	// A pass reads every payout, ledger entry, grant and submission: on a
	// big run, fewer passes leave the machine to the workload.
	interval := 5*time.Second + time.Duration(c.cfg.payouts)*time.Millisecond
	c.recStop, c.recDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(c.recDone)
		for {
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "PAYOUTS_TOKEN="+r.Tokens.Reconciler)
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				code = -1
			}
			c.recMu.Lock()
			c.recPasses[code]++
			if code < 0 || code > 2 {
				c.recErr = fmt.Errorf("reconcile --once: exit %d (%v):\n%s", code, err, tailLines(string(out), 30))
			}
			c.recMu.Unlock()
			select {
			case <-c.recStop:
				return
			case <-time.After(interval): // the pass interval
			}
		}
	}()
}

// stopReconciler ends the reconciler passes (the one running finishes).
func (c *chaosRun) stopReconciler() {
	close(c.recStop)
	<-c.recDone
	c.recMu.Lock()
	defer c.recMu.Unlock()
	c.t.Logf("reconciler passes during the run, by exit code: %v", c.recPasses)
	if c.recErr != nil {
		c.t.Error(c.recErr)
	}
}

// checkProcesses: no process the chaos did not kill may have exited.
func (c *chaosRun) checkProcesses() {
	t := c.t
	if c.stale != nil && !c.stale.exitChecked && c.stale.p.Exited() {
		c.stale.exitChecked = true
		code, _ := c.stale.p.Wait(time.Second)
		t.Errorf("the stale writer exited on its own (exit %d):\n%s", code, tailLines(c.stale.p.Log(), 40))
	}
	for _, e := range c.execs {
		if e.killedByUs || e.exitChecked || !e.p.Exited() {
			continue
		}
		e.exitChecked = true
		code, _ := e.p.Wait(time.Second)
		t.Errorf("executor %s exited on its own (exit %d):\n%s", e.p.Name, code, tailLines(e.p.Log(), 40))
		c.startExecutor()
	}
	for _, sv := range c.services() {
		if sv.p.Exited() {
			code, _ := sv.p.Wait(time.Second)
			t.Fatalf("%s exited on its own (exit %d):\n%s", sv.p.Name, code, tailLines(sv.p.Log(), 40))
		}
	}
}
