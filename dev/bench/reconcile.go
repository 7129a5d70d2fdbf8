// Package bench holds the benchmarks of `payouts bench`: each starts what
// it measures on this machine, loads it, and reports one JSON line.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/rail/railclient"
)

// ReconcileOptions configure `payouts bench reconcile`.
type ReconcileOptions struct {
	// Payouts is how many terminal payouts to load.
	Payouts int
	// PerGrant is how many payouts share one account and one grant (an
	// executor drives up to 50 payouts per grant).
	PerGrant int
	// Dir holds the throwaway stack; a temporary directory when empty.
	Dir string
	// Binary is the payouts executable (default: this one).
	Binary string
	// RailPerPayout runs the pass with --rail-per-payout.
	RailPerPayout bool
	// ReconcileArgs are extra flags of the measured `payouts reconcile`.
	ReconcileArgs []string
	// CPUProfile, when set, runs the pass in this process (InProcessPass)
	// instead of a child and writes its CPU profile there (peak RSS is then
	// this process's, loader included).
	CPUProfile string
	// InProcessPass runs one `reconcile --once --json` pass in this process
	// and returns its JSON report and exit code (the command tree wires
	// the reconciler in: dev tooling sees roles only through clients).
	InProcessPass func(ctx context.Context, urls PassURLs) (report []byte, exitCode int, err error)
	// NewRail builds the rail stub's handler, run in this process (its
	// payments live in memory, so the bench loads it through this
	// handler). Its authenticator accepts RailPayToken for payments (the
	// proxy's role), RailLookupToken for lookups (the reconciler's role)
	// and RailReportToken for the settlement report (an operator's): the
	// reconciler is given the last two as its rail credentials.
	NewRail                                        func() (http.Handler, error)
	RailPayToken, RailLookupToken, RailReportToken string
	// EtcdPrefix is the lock service's etcd key prefix.
	EtcdPrefix string
	Logger     *slog.Logger
}

// PassURLs is where the measured pass finds the services.
type PassURLs struct {
	LockURL, PaymentURL, ProxyURL, RailURL string
	Token, RailToken, RailReportToken      string
	RailPerPayout                          bool
}

// ReconcileResult is the JSON line of `payouts bench reconcile --json`.
type ReconcileResult struct {
	Payouts   int     `json:"payouts"`
	Seconds   float64 `json:"seconds"`
	Findings  int     `json:"findings"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// Load is how long loading took (not part of the measurement).
	LoadSeconds float64 `json:"load_seconds"`
	Accounts    int     `json:"accounts"`
	ExitCode    int     `json:"exit_code"`
	// CPUSeconds is the CPU each process used during the pass.
	CPUSeconds map[string]float64 `json:"cpu_s"`
}

const benchAmount = 100

// Reconcile starts a local stack, loads opts.Payouts POSTED payouts with
// their ledger, history, grants, submissions and rail payments, then times
// one `payouts reconcile --once --json` pass as a child process (its peak
// RSS is the child's).
func Reconcile(ctx context.Context, opts ReconcileOptions) (res ReconcileResult, err error) {
	if opts.Payouts < 1 {
		return ReconcileResult{}, errors.New("bench reconcile: --payouts must be at least 1")
	}
	if opts.PerGrant <= 0 {
		opts.PerGrant = 50
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "payouts-bench-reconcile-")
		if err != nil {
			return ReconcileResult{}, err
		}
		defer os.RemoveAll(dir)
		opts.Dir = dir
	}
	st, err := stack.Start(ctx, stack.Options{Dir: opts.Dir, Binary: opts.Binary, Logger: opts.Logger, SettlementWindow: time.Second, RailTimeout: 5 * time.Second})
	if err != nil {
		return ReconcileResult{}, fmt.Errorf("start the stack: %w", err)
	}
	defer st.Stop()

	// The rail stub keeps its payments in memory: the bench runs one in
	// this process and loads it through its own API, in process.
	if opts.NewRail == nil {
		return ReconcileResult{}, errors.New("bench reconcile: no rail")
	}
	railHandler, err := opts.NewRail()
	if err != nil {
		return ReconcileResult{}, err
	}
	railURL, railLoad, stopRail, err := serveRail(railHandler, opts.RailPayToken)
	if err != nil {
		return ReconcileResult{}, err
	}
	defer stopRail()

	l := &loader{n: opts.Payouts, perGrant: opts.PerGrant, ready: st.Ready, etcdPrefix: opts.EtcdPrefix}
	l.accounts = (l.n + l.perGrant - 1) / l.perGrant
	start := time.Now()
	if err := l.load(ctx, railLoad); err != nil {
		return ReconcileResult{}, err
	}
	res = ReconcileResult{Payouts: l.n, Accounts: l.accounts, LoadSeconds: time.Since(start).Seconds()}
	opts.Logger.Info("loaded", "payouts", l.n, "accounts", l.accounts, "seconds", res.LoadSeconds)

	// The loader's garbage is this process's, not the pass's: collect it
	// before the pass is measured (this process serves the rail).
	runtime.GC()
	meter := newCPUMeter()
	for name, pid := range st.Ready.PIDs {
		meter.add(name, pid, name == "postgres")
	}
	if err := meter.start(); err != nil {
		return res, err
	}
	if opts.CPUProfile != "" {
		res, err = profilePass(ctx, res, opts, PassURLs{LockURL: st.Ready.LockURL, PaymentURL: st.Ready.PaymentURL, ProxyURL: st.Ready.ProxyURL,
			RailURL: railURL, Token: st.Ready.Tokens.Reconciler,
			RailToken: opts.RailLookupToken, RailReportToken: opts.RailReportToken})
		res.CPUSeconds = cpuSeconds(meter)
		return res, err
	}
	bin := opts.Binary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return res, err
		}
	}
	r := st.Ready
	args := append([]string{"reconcile", "--once", "--json", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
		"--proxy-url", r.ProxyURL, "--rail-url", railURL, "--log-level", "warn"}, opts.ReconcileArgs...)
	if opts.RailPerPayout {
		args = append(args, "--rail-per-payout")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	// Credentials through the environment, off the command line.
	cmd.Env = append(os.Environ(), "PAYOUTS_TOKEN="+r.Tokens.Reconciler,
		"PAYOUTS_RAIL_TOKEN="+opts.RailLookupToken, "PAYOUTS_RAIL_REPORT_TOKEN="+opts.RailReportToken)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	hwm := watchHWM(cmd.Process.Pid)
	err = cmd.Wait()
	res.Seconds = time.Since(t0).Seconds()
	res.PeakRSSMB = hwm()
	res.CPUSeconds = cpuSeconds(meter)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return res, err
	}
	// (The rusage's maxrss is not the pass's: a child shares this
	// process's memory — the loaded rail — until it execs.)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		if res.CPUSeconds != nil {
			res.CPUSeconds["reconcile"] = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		}
	}
	if res.ExitCode > 1 || countFindings(&res, out.Bytes()) != nil {
		return res, fmt.Errorf("reconcile exited %d: %s", res.ExitCode, tailText(errb.String(), 2000))
	}
	return res, nil
}

// watchHWM samples pid's peak resident set (VmHWM, a high-water mark of
// the image it runs now) every 50 ms until the returned function is
// called, which gives the last sample in MB. Only the last 50 ms of the
// process's life go unseen.
func watchHWM(pid int) func() float64 {
	path := fmt.Sprintf("/proc/%d/status", pid)
	var mu sync.Mutex
	peak := 0.0
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if b, err := os.ReadFile(path); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					var kb float64
					if _, err := fmt.Sscanf(line, "VmHWM: %f kB", &kb); err == nil {
						mu.Lock()
						peak = max(peak, kb/1024)
						mu.Unlock()
					}
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// cpuSeconds is each watched process's CPU seconds since the meter
// started (nil when a process could not be read).
func cpuSeconds(m *cpuMeter) map[string]float64 {
	d, err := m.since()
	if err != nil {
		return nil
	}
	out := make(map[string]float64, len(d))
	for k, v := range d {
		out[k] = v.Seconds()
	}
	return out
}

func tailText(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// serveRail serves the rail handler on a loopback port. load pays one
// payment through the handler directly (no socket) and returns its rail
// reference.
func serveRail(h http.Handler, token string) (url string, load func(railclient.PaymentRequest) (string, error), stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, nil, err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	load = func(p railclient.PaymentRequest) (string, error) {
		body, _ := json.Marshal(p)
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var got railclient.Payment
		if w.Code != http.StatusOK && w.Code != http.StatusCreated {
			return "", fmt.Errorf("rail refused a payment: %d %s", w.Code, strings.TrimSpace(w.Body.String()))
		}
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			return "", err
		}
		return got.RailRef, nil
	}
	return "http://" + ln.Addr().String(), load, func() { _ = hs.Close() }, nil
}

// profilePass runs the pass in this process under the CPU profiler.
func profilePass(ctx context.Context, res ReconcileResult, opts ReconcileOptions, urls PassURLs) (ReconcileResult, error) {
	urls.RailPerPayout = opts.RailPerPayout
	if opts.InProcessPass == nil {
		return res, errors.New("bench reconcile: no in-process pass to profile")
	}
	f, err := os.Create(opts.CPUProfile)
	if err != nil {
		return res, err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return res, err
	}
	t0 := time.Now()
	report, code, err := opts.InProcessPass(ctx, urls)
	res.Seconds = time.Since(t0).Seconds()
	pprof.StopCPUProfile()
	res.ExitCode = code
	if err != nil {
		return res, err
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		res.PeakRSSMB = float64(ru.Maxrss) / 1024
	}
	return res, countFindings(&res, report)
}

func countFindings(res *ReconcileResult, report []byte) error {
	var rep struct {
		Counts map[string]int `json:"counts"`
	}
	if err := json.Unmarshal(report, &rep); err != nil {
		return fmt.Errorf("reconcile report: %w", err)
	}
	for _, n := range rep.Counts {
		res.Findings += n
	}
	return nil
}
