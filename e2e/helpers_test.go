package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Shared helpers for whole-system tests. Names are generic on purpose:
// every role's e2e file uses them.

// devBundle is what a test of the dev tooling's commands (dev up, dev
// demo, serve lock --etcd-embed-dir) works with: the binary and a fresh
// directory. setup builds it; its methods run the commands.
type devBundle struct {
	t        *testing.T
	bin      string
	dir      string
	dumpLogs bool // a failure dumps the stack's logs (registered once)
}

// setup returns the bundle of a dev-tooling test.
func setup(t *testing.T) *devBundle {
	t.Helper()
	return &devBundle{t: t, bin: proctest.Binary(t), dir: t.TempDir()}
}

// command is one run of the binary with its stdout and stderr captured
// together, as a terminal would show them.
type command struct {
	cmd  *exec.Cmd
	out  *syncWriter
	done chan struct{}
	err  error
}

// start runs the binary with args and extra environment (env may be nil);
// it is killed when the test ends if it is still running.
func (b *devBundle) start(env []string, args ...string) *command {
	b.t.Helper()
	c := &command{cmd: exec.Command(b.bin, args...), out: &syncWriter{}, done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	b.t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

// wait waits for the command to exit and returns its exit code.
func (c *command) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		t.Fatalf("%s did not exit within %s; output:\n%s", c.cmd.Args[1:], timeout, tailLines(c.output(), 40))
	}
	return c.cmd.ProcessState.ExitCode()
}

// output is everything the command has printed so far.
func (c *command) output() string { return c.out.String() }

// waitLine waits until the command prints a line starting with prefix.
func (c *command) waitLine(t *testing.T, timeout time.Duration, prefix string) string {
	t.Helper()
	var line string
	waitUntil(t, timeout, "a line starting with "+prefix, func() (bool, error) {
		for _, l := range strings.Split(c.output(), "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
				return true, nil
			}
		}
		select {
		case <-c.done:
			t.Fatalf("%s exited (%v) before printing %q:\n%s", c.cmd.Args[1:], c.err, prefix, tailLines(c.output(), 40))
		default:
		}
		return false, nil
	})
	return line
}

// consoleTrouble lists the lines of a console that look like a failure: a
// log line at level error, a panic, or a Go stack trace.
func consoleTrouble(out string) []string {
	var bad []string
	for _, line := range strings.Split(out, "\n") {
		var rec struct {
			Level string `json:"level"`
		}
		switch {
		case json.Unmarshal([]byte(line), &rec) == nil && strings.EqualFold(rec.Level, "error"):
		case strings.Contains(line, "level=ERROR"), strings.Contains(line, "panic"), goroutineHeader.MatchString(line):
		default:
			continue
		}
		bad = append(bad, line)
	}
	return bad
}

var goroutineHeader = regexp.MustCompile(`goroutine \d+ \[`)

// checkCleanConsole fails the test if out holds anything that looks like a
// failure (consoleTrouble).
func checkCleanConsole(t *testing.T, what, out string) {
	t.Helper()
	if bad := consoleTrouble(out); len(bad) > 0 {
		t.Errorf("%s printed what reads as a failure:\n%s\n--- whole output ---\n%s", what, strings.Join(bad, "\n"), out)
	}
}

// system is a running local stack with clients for every service.
type system struct {
	st    *stack.Stack
	pay   *pc.Client // operator token
	proxy *proxyclient.Client
	rail  *railclient.Client // operator token (faults, settlement report)
	lock  *lockclient.Client // operator token
}

// startSystem brings up a stack in a temp dir and stops it at test end.
func startSystem(t *testing.T, opts stack.Options) *system {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	opts.Binary = proctest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, path := range st.Ready.Logs {
				b, _ := os.ReadFile(path)
				t.Logf("--- %s log (%s), tail ---\n%s", name, path, tailLines(string(b), 25))
			}
		}
		_ = st.Stop()
	})
	s := &system{st: st}
	op := st.Ready.Tokens.Operator
	if s.pay, err = pc.New(st.Ready.PaymentURL, op); err != nil {
		t.Fatal(err)
	}
	if s.proxy, err = proxyclient.New(st.Ready.ProxyURL, op); err != nil {
		t.Fatal(err)
	}
	if s.rail, err = railclient.New(st.Ready.RailURL, op); err != nil {
		t.Fatal(err)
	}
	if s.lock, err = lockclient.New(st.Ready.LockURL, lockclient.WithToken(op)); err != nil {
		t.Fatal(err)
	}
	return s
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ctxT is a context for one test operation.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond every 100ms until it is true or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok && err == nil {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createAccount makes an account with an opening balance.
func (s *system) createAccount(t *testing.T, id string, balance int64) {
	t.Helper()
	if _, err := s.pay.CreateAccount(ctxT(t, 30*time.Second), pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: balance}); err != nil {
		t.Fatalf("create account %s: %v", id, err)
	}
}

// createPayout makes a PENDING payout.
func (s *system) createPayout(t *testing.T, id, account string, amount int64, beneficiary string) pc.Payout {
	t.Helper()
	p, err := s.pay.CreatePayout(ctxT(t, 30*time.Second), pc.CreatePayoutRequest{
		ID: id, AccountID: account, Amount: amount, Currency: "EUR", BeneficiaryRef: beneficiary})
	if err != nil {
		t.Fatalf("create payout %s: %v", id, err)
	}
	return p
}

// payouts lists every payout (optionally of one account).
func (s *system) payouts(t *testing.T, account string) []pc.Payout {
	t.Helper()
	var out []pc.Payout
	f := pc.PayoutFilter{AccountID: account, Limit: 1000}
	for {
		page, err := s.pay.Payouts(ctxT(t, 30*time.Second), f)
		if err != nil {
			t.Fatalf("list payouts: %v", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out
		}
		f.After = page.Next
	}
}

// payout reads one payout.
func (s *system) payout(t *testing.T, id string) pc.Payout {
	t.Helper()
	p, err := s.pay.Payout(ctxT(t, 30*time.Second), id)
	if err != nil {
		t.Fatalf("get payout %s: %v", id, err)
	}
	return p
}

// waitPayoutState waits until payout id is in one of states and returns it.
func (s *system) waitPayoutState(t *testing.T, id string, timeout time.Duration, states ...pc.State) pc.Payout {
	t.Helper()
	var p pc.Payout
	waitUntil(t, timeout, fmt.Sprintf("payout %s to reach %v", id, states), func() (bool, error) {
		var err error
		p, err = s.pay.Payout(context.Background(), id)
		if err != nil {
			return false, err
		}
		for _, st := range states {
			if p.State == st {
				return true, nil
			}
		}
		return false, fmt.Errorf("payout %s is %s", id, p.State)
	})
	return p
}

// railPayments returns the rail's settlement report by client reference.
func (s *system) railPayments(t *testing.T) map[string][]railclient.Payment {
	t.Helper()
	items, err := s.rail.SettlementReport(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatalf("settlement report: %v", err)
	}
	out := map[string][]railclient.Payment{}
	for _, p := range items {
		out[p.ClientRef] = append(out[p.ClientRef], p)
	}
	return out
}

// paySafetyEvents and proxySafetyEvents read every safety event.
func (s *system) paySafetyEvents(t *testing.T) []pc.SafetyEvent {
	t.Helper()
	var out []pc.SafetyEvent
	var after int64
	for {
		page, err := s.pay.SafetyEvents(ctxT(t, 30*time.Second), after, 1000)
		if err != nil {
			t.Fatalf("payment safety events: %v", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out
		}
		after = page.Items[len(page.Items)-1].ID
	}
}

func (s *system) proxySafetyEvents(t *testing.T) []proxyclient.SafetyEvent {
	t.Helper()
	var out []proxyclient.SafetyEvent
	after := ""
	for {
		page, err := s.proxy.SafetyEvents(ctxT(t, 30*time.Second), after, 1000)
		if err != nil {
			t.Fatalf("proxy safety events: %v", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out
		}
		after = page.Next
	}
}

// hostPort is the host:port of a service URL.
func hostPort(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.Host
}

// restartLock starts a lock service on the stack's lock address again
// (after st.StopRole("lock", ...)), as a child of the test.
func (s *system) restartLock(t *testing.T, name string) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	p := proctest.Start(t, name, nil, "serve", "lock", "--listen", hostPort(t, r.LockURL),
		"--auth-file", filepath.Join(r.Dir, "auth.json"), "--backend", "etcd", "--etcd-endpoints", strings.Join(r.Etcd, ","))
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.LockURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// startProxy starts a rail proxy on the stack's proxy address (after
// st.StopRole("proxy", ...)) with extra environment (e.g. a crash point).
func (s *system) startProxy(t *testing.T, name string, env []string, railTimeout time.Duration) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	p := proctest.Start(t, name, env, "serve", "proxy", "--listen", hostPort(t, r.ProxyURL),
		"--auth-file", filepath.Join(r.Dir, "auth.json"), "--database-url", s.st.ServingDatabaseURLs().ProxyDB,
		"--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["proxy"], "--rail-timeout", railTimeout.String())
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.ProxyURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// logLines decodes a JSON log and returns the lines whose msg contains substr.
func logLines(log, substr string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, substr) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			if msg, _ := m["msg"].(string); strings.Contains(msg, substr) {
				out = append(out, m)
			}
		}
	}
	return out
}

// syncWriter is a buffer several goroutines write to (a child's stdout and
// stderr).
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
