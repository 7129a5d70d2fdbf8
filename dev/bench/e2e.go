// Package bench holds the benchmarks behind `payouts bench`: each starts
// what it needs (or uses given URLs), drives the real processes, and
// reports one result line.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/payouts/payouts/dev/cpucap"
	"github.com/payouts/payouts/dev/stack"
)

// DefaultE2EConcurrency is each executor's --concurrency unless
// --concurrency says otherwise. On two cores 8 workers keep the database
// busy; more of them only visit accounts sooner, with fewer payouts
// waiting, so each transaction carries fewer (docs/benchmarks-history.md, in
// alternating runs of 1,000 × 20,000: 8 workers did 819–858 payouts/s at
// 2.2–2.3 CPU-s per 1,000, 16 did 692–733 at 2.6–2.7, 32 did 540 at 3.5;
// 4 did no more than 8, with longer waits).
const DefaultE2EConcurrency = 8

// E2EOptions configures one end-to-end run (`payouts bench e2e`).
type E2EOptions struct {
	Accounts    int
	Payouts     int
	Executors   int
	Concurrency int // per executor
	// PollInterval is each executor's --poll-interval.
	PollInterval time.Duration
	// RailLatency is the rail stub's answer delay (PUT /faults latency_ms).
	RailLatency time.Duration
	// RailTimeout is every proxy's --rail-timeout (0: the stack's default);
	// a proxy starved of CPU (RoleCPUs) needs longer to read the rail's
	// answer before it gives up and records the payout ambiguous.
	RailTimeout time.Duration
	// Rate is the offered load in payouts created per second; 0 creates
	// them as fast as the loaders go.
	Rate float64
	// LoadWorkers is how many payouts are created at once.
	LoadWorkers int
	// Replicas is how many payment-resource and rail-proxy processes run
	// over the same databases when the bench starts the stack itself;
	// executors are spread over them.
	Replicas int
	// RoleCPUs, when above 0, limits each payment-resource and rail-proxy
	// process the bench starts to this many CPUs (a cgroup CPU quota, as a
	// container's CPU limit; package cpucap), so that a replica brings CPU
	// of its own, as it would on a machine of its own: on one machine the
	// processes otherwise share the same cores. Local stack only; needs a
	// writable cgroup CPU controller (root on Linux).
	RoleCPUs float64
	// Timeout bounds the wait for every payout to become terminal.
	Timeout time.Duration
	// Baseline, when set (BaselineRiver), also runs the same work the way
	// a team would without fencing, first, on the same local stack's
	// PostgreSQL and rail stub, and reports it beside payouts' result.
	Baseline string
	// BaselineWorkers is the baseline's River workers (default
	// DefaultRiverWorkers).
	BaselineWorkers int
	// Rounds is how many times each system runs (default 1). With a
	// baseline the runs alternate, the baseline first in odd rounds and
	// payouts first in even ones (baseline, payouts, payouts, baseline,
	// ...), so that drift in the machine's speed during the run falls on
	// both alike. The result pools the rounds (E2EResult.Rounds).
	Rounds int

	// External system: when PaymentURLs is set, no stack is started.
	PaymentURLs   []string
	ProxyURLs     []string
	LockURL       string
	RailURL       string
	ExecutorToken string
	OperatorToken string

	// Dir holds the throwaway stack and every log (a temp dir when empty,
	// removed afterwards).
	Dir string
	// Binary is the payouts executable (default: this one).
	Binary string
	// ProfileDir, when set, receives CPU profiles of every process
	// (children run with --pprof-listen on a loopback port of their own).
	ProfileDir string
	Logger     *slog.Logger
}

// E2EResult is the result line of one run.
type E2EResult struct {
	Payouts       int                `json:"payouts"`
	Accounts      int                `json:"accounts"`
	Executors     int                `json:"executors"`
	PayoutsPerSec float64            `json:"payouts_per_sec"`
	P50Ms         float64            `json:"p50_ms"`
	P99Ms         float64            `json:"p99_ms"`
	Duplicates    int                `json:"duplicates"`
	CPUPer1000    map[string]float64 `json:"cpu_s_per_1000"`
	// The baseline run (--baseline), when there was one: what it is, its
	// figures, and payouts' rate divided by its rate.
	Baseline              string             `json:"baseline,omitempty"`
	BaselinePayoutsPerSec float64            `json:"baseline_payouts_per_sec,omitempty"`
	BaselineP50Ms         float64            `json:"baseline_p50_ms,omitempty"`
	BaselineP99Ms         float64            `json:"baseline_p99_ms,omitempty"`
	BaselineDuplicates    int                `json:"baseline_duplicates,omitempty"`
	BaselineCPUPer1000    map[string]float64 `json:"baseline_cpu_s_per_1000,omitempty"`
	BaselineWorkers       int                `json:"baseline_workers,omitempty"`
	Ratio                 float64            `json:"ratio,omitempty"`
	// Rounds lists every run in the order they ran when there was more
	// than one round. The figures above then pool them: payouts, posted,
	// failed, ambiguous, duplicates and seconds are sums, so the rate is
	// every round's payouts over every round's time; CPU per 1,000
	// payouts is the mean of the rounds' (each ran the same payouts);
	// p50, p99, the claim waits and the paths are the median of the rounds'; max is
	// the largest.
	Rounds []E2ERound `json:"rounds,omitempty"`

	Concurrency int `json:"concurrency"`
	Replicas    int `json:"replicas"`
	// RoleCPUs is E2EOptions.RoleCPUs, and Throttled how long each limited
	// process was held back by its limit during the run (seconds; summed
	// over rounds): time it would have run had it had more CPU.
	RoleCPUs      float64            `json:"role_cpus,omitempty"`
	Throttled     map[string]float64 `json:"throttled_s,omitempty"`
	RailLatencyMs int64              `json:"rail_latency_ms"`
	OfferedRate   float64            `json:"offered_rate"`
	Seconds       float64            `json:"seconds"`
	MaxMs         float64            `json:"max_ms"`
	// ClaimWaitP50Ms and ClaimWaitP99Ms are the part of the latency spent
	// before an executor claimed the payout (created to claimed_at): the
	// queue, as against the path through the guards and the rail.
	ClaimWaitP50Ms float64 `json:"claim_wait_p50_ms"`
	ClaimWaitP99Ms float64 `json:"claim_wait_p99_ms"`
	// PathP50Ms and PathP99Ms are the quantiles of the rest: claimed_at to
	// terminal, the path through the guards and the rail.
	PathP50Ms float64 `json:"path_p50_ms"`
	PathP99Ms float64 `json:"path_p99_ms"`
	Posted    int     `json:"posted"`
	Failed    int     `json:"failed"`
	Ambiguous int     `json:"ambiguous"`
	LoadAvg   string  `json:"loadavg"`

	// Timeline is completions and latency per second of the run (for the plot).
	Timeline []E2ESecond `json:"-"`
}

// E2ERound is one run of one system within a multi-round run.
type E2ERound struct {
	Round         int                `json:"round"`
	System        string             `json:"system"` // "payouts" or the baseline's name
	PayoutsPerSec float64            `json:"payouts_per_sec"`
	P99Ms         float64            `json:"p99_ms"`
	CPUPer1000    map[string]float64 `json:"cpu_s_per_1000"` // per process, as at the top level
}

// E2ESecond is one second of a run.
type E2ESecond struct {
	Created, Done int
	P50Ms, P99Ms  float64
}

func (o *E2EOptions) defaults() error {
	if o.Accounts < 1 || o.Payouts < 1 {
		return errors.New("bench e2e: --accounts and --payouts must be at least 1")
	}
	if o.Executors == 0 {
		o.Executors = 1
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultE2EConcurrency
	}
	if o.Executors < 1 || o.Concurrency < 1 || o.Concurrency > 256 {
		return errors.New("bench e2e: --executors must be at least 1 and --concurrency from 1 to 256")
	}
	if o.PollInterval == 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.LoadWorkers == 0 {
		o.LoadWorkers = 16
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Replicas < 1 || o.Replicas > 8 {
		return errors.New("bench e2e: --replicas must be from 1 to 8")
	}
	if o.Rate < 0 || o.RailLatency < 0 {
		return errors.New("bench e2e: --rate and --rail-latency must not be negative")
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	if o.BaselineWorkers == 0 {
		o.BaselineWorkers = DefaultRiverWorkers
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	switch {
	case o.Rounds < 1 || o.Rounds > 10:
		return errors.New("bench e2e: --rounds must be from 1 to 10")
	case o.BaselineWorkers < 1 || o.BaselineWorkers > 1000:
		return errors.New("bench e2e: --baseline-workers must be from 1 to 1000")
	case o.Baseline != "" && o.Baseline != BaselineRiver:
		return fmt.Errorf("bench e2e: --baseline %q: the one baseline is %q", o.Baseline, BaselineRiver)
	case o.Baseline != "" && len(o.PaymentURLs) > 0:
		return errors.New("bench e2e: --baseline runs on the local stack the bench starts: not with --payment-urls")
	case o.RoleCPUs < 0 || o.RoleCPUs > 64:
		return errors.New("bench e2e: --role-cpus must be from 0 (no limit) to 64")
	case o.RoleCPUs > 0 && len(o.PaymentURLs) > 0:
		return errors.New("bench e2e: --role-cpus limits the processes the bench starts: not with --payment-urls")
	case o.RoleCPUs > 0 && o.Baseline != "":
		return errors.New("bench e2e: --role-cpus limits payouts' roles, which the baseline does not have: its ratio would compare a limited system with an unlimited one")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if len(o.PaymentURLs) > 0 {
		switch {
		case len(o.ProxyURLs) == 0 || o.LockURL == "" || o.RailURL == "":
			return errors.New("bench e2e: with --payment-urls, --proxy-urls, --lock-url and --rail-url are required too")
		case o.ExecutorToken == "" || o.OperatorToken == "":
			return errors.New("bench e2e: with --payment-urls, --executor-token and --operator-token are required")
		}
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Binary = exe
	}
	return nil
}

// e2eSystem is what a run talks to.
type e2eSystem struct {
	paymentURLs, proxyURLs []string
	lockURL, railURL       string
	executorToken          string
	operatorToken          string
	st                     *stack.Stack
	procs                  *children
	cpu                    *cpuMeter
	logs                   map[string]string // process name -> its log file
	caps                   []roleCap         // --role-cpus
}

// roleCap is a process held to --role-cpus.
type roleCap struct {
	name string
	g    *cpucap.Group
}

// RunE2E runs the end-to-end benchmark once.
func RunE2E(ctx context.Context, o E2EOptions) (E2EResult, error) {
	if err := o.defaults(); err != nil {
		return E2EResult{}, err
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "payouts-bench-e2e-")
		if err != nil {
			return E2EResult{}, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	sys, err := bringUp(ctx, o)
	if sys != nil {
		defer sys.down(o.Logger)
	}
	if err != nil {
		return E2EResult{}, err
	}
	var mine, base []E2EResult
	var rounds []E2ERound
	for r := range o.Rounds {
		systems := []string{"payouts"}
		if o.Baseline != "" {
			// The baseline runs on fresh tables of its own, on the same
			// machine, PostgreSQL and rail stub as payouts.
			systems = []string{o.Baseline, "payouts"}
			if r%2 == 1 {
				systems = []string{"payouts", o.Baseline}
			}
		}
		for _, system := range systems {
			if o.Rounds > 1 {
				o.Logger.Info("round", "round", r+1, "rounds", o.Rounds, "system", system)
			}
			var res E2EResult
			if system == "payouts" {
				res, err = runE2E(ctx, o, sys)
				mine = append(mine, res)
			} else {
				res, err = runRiverBaseline(ctx, o, sys)
				base = append(base, res)
			}
			if err != nil {
				if system != "payouts" {
					err = fmt.Errorf("baseline %s: %w", o.Baseline, err)
				}
				return res, err
			}
			rounds = append(rounds, E2ERound{Round: r + 1, System: system, PayoutsPerSec: res.PayoutsPerSec,
				P99Ms: res.P99Ms, CPUPer1000: res.CPUPer1000})
		}
	}
	res := poolRounds(mine)
	if o.Rounds > 1 {
		res.Rounds = rounds
	}
	if o.Baseline != "" {
		b := poolRounds(base)
		res.Baseline, res.BaselineWorkers = o.Baseline, o.BaselineWorkers
		res.BaselinePayoutsPerSec, res.BaselineP50Ms, res.BaselineP99Ms = b.PayoutsPerSec, b.P50Ms, b.P99Ms
		res.BaselineDuplicates, res.BaselineCPUPer1000 = b.Duplicates, b.CPUPer1000
		if b.PayoutsPerSec > 0 {
			res.Ratio = round3(res.PayoutsPerSec / b.PayoutsPerSec)
		}
	}
	return res, nil
}

// poolRounds is one system's rounds as one result (see E2EResult.Rounds);
// the shape, load average and timeline are the last round's.
func poolRounds(rs []E2EResult) E2EResult {
	res := rs[len(rs)-1]
	if len(rs) == 1 {
		return res
	}
	res.Payouts, res.Posted, res.Failed, res.Ambiguous, res.Duplicates, res.Seconds = 0, 0, 0, 0, 0, 0
	res.CPUPer1000 = map[string]float64{}
	if res.Throttled != nil {
		res.Throttled = map[string]float64{}
		for _, r := range rs {
			for name, v := range r.Throttled {
				res.Throttled[name] = round3(res.Throttled[name] + v)
			}
		}
	}
	var p50, p99, w50, w99, c50, c99 []float64
	for _, r := range rs {
		res.Payouts += r.Payouts
		res.Posted += r.Posted
		res.Failed += r.Failed
		res.Ambiguous += r.Ambiguous
		res.Duplicates += r.Duplicates
		res.Seconds += r.Seconds
		res.MaxMs = max(res.MaxMs, r.MaxMs)
		for name, v := range r.CPUPer1000 {
			res.CPUPer1000[name] += v / float64(len(rs))
		}
		p50, p99 = append(p50, r.P50Ms), append(p99, r.P99Ms)
		w50, w99 = append(w50, r.ClaimWaitP50Ms), append(w99, r.ClaimWaitP99Ms)
		c50, c99 = append(c50, r.PathP50Ms), append(c99, r.PathP99Ms)
	}
	for name, v := range res.CPUPer1000 {
		res.CPUPer1000[name] = round3(v)
	}
	res.Seconds = round3(res.Seconds)
	res.PayoutsPerSec = round3(float64(res.Payouts) / res.Seconds)
	res.P50Ms, res.P99Ms = median(p50), median(p99)
	res.ClaimWaitP50Ms, res.ClaimWaitP99Ms = median(w50), median(w99)
	res.PathP50Ms, res.PathP99Ms = median(c50), median(c99)
	return res
}

// median of xs (not empty): the middle value, or the mean of the two.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return round3((s[n/2-1] + s[n/2]) / 2)
}

// SumCPU is every process's CPU per 1,000 payouts, summed.
func SumCPU(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// bringUp starts the stack (or adopts the given URLs) and the executors.
func bringUp(ctx context.Context, o E2EOptions) (*e2eSystem, error) {
	sys := &e2eSystem{procs: &children{bin: o.Binary, dir: o.Dir}, cpu: newCPUMeter(), logs: map[string]string{}}
	sys.cpu.add("bench", os.Getpid(), false)
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return sys, err
		}
		// Every child inherits the environment: each serves pprof on a
		// port of its own and logs it.
		if err := os.Setenv(pprofEnv, "127.0.0.1:0"); err != nil {
			return sys, err
		}
	}
	if len(o.PaymentURLs) > 0 {
		sys.paymentURLs, sys.proxyURLs = o.PaymentURLs, o.ProxyURLs
		sys.lockURL, sys.railURL = o.LockURL, o.RailURL
		sys.executorToken, sys.operatorToken = o.ExecutorToken, o.OperatorToken
	} else if err := sys.startStack(ctx, o); err != nil {
		return sys, err
	}
	for i := 1; i <= o.Executors; i++ {
		name := "executor-" + strconv.Itoa(i)
		// The token travels in the environment, never on a command line.
		c, err := sys.procs.start(name, []string{"PAYOUTS_TOKEN=" + sys.executorToken}, "run", "executor",
			"--owner", "bench-"+name,
			"--lock-url", sys.lockURL,
			"--payment-url", sys.paymentURLs[(i-1)%len(sys.paymentURLs)],
			"--proxy-url", sys.proxyURLs[(i-1)%len(sys.proxyURLs)],
			"--concurrency", strconv.Itoa(o.Concurrency),
			"--poll-interval", o.PollInterval.String())
		if err != nil {
			return sys, err
		}
		sys.cpu.add(name, c.Pid(), false)
		sys.logs[name] = c.Spec.Log
	}
	return sys, nil
}

// startStack runs the local stack (as `payouts dev up` does) plus the
// extra payment-resource and proxy replicas.
func (sys *e2eSystem) startStack(ctx context.Context, o E2EOptions) error {
	st, err := stack.Start(ctx, stack.Options{Dir: filepath.Join(o.Dir, "stack"), Binary: o.Binary, Logger: o.Logger, RailTimeout: o.railTimeout()})
	if err != nil {
		return err
	}
	sys.st = st
	r := st.Ready
	sys.paymentURLs, sys.proxyURLs = []string{r.PaymentURL}, []string{r.ProxyURL}
	sys.lockURL, sys.railURL = r.LockURL, r.RailURL
	sys.executorToken, sys.operatorToken = r.Tokens.Executor, r.Tokens.Operator
	for _, name := range []string{"lock", "payment", "proxy", "rail"} {
		sys.cpu.add(name, r.PIDs[name], false)
		sys.logs[name] = r.Logs[name]
	}
	if pid, ok := r.PIDs["postgres"]; ok {
		sys.cpu.add("postgres", pid, true)
	}
	authFile := filepath.Join(r.Dir, "auth.json")
	payDB, err := writeSecretFile(o.Dir, "paydb.url", st.ServingDatabaseURLs().PayDB)
	if err != nil {
		return err
	}
	proxyDB, err := writeSecretFile(o.Dir, "proxydb.url", st.ServingDatabaseURLs().ProxyDB)
	if err != nil {
		return err
	}
	for i := 2; i <= o.Replicas; i++ {
		pay, err := sys.startServer(ctx, "payment-"+strconv.Itoa(i), "serve", "payment",
			"--database-url-file", payDB, "--listen", "127.0.0.1:0", "--auth-file", authFile)
		if err != nil {
			return err
		}
		prx, err := sys.startServer(ctx, "proxy-"+strconv.Itoa(i), "serve", "proxy",
			"--database-url-file", proxyDB, "--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["proxy"],
			// The stack proxy's: a proxy resolves a submission another
			// forwarded by the send window of its own flags.
			"--rail-timeout", o.railTimeout().String(),
			"--listen", "127.0.0.1:0", "--auth-file", authFile)
		if err != nil {
			return err
		}
		sys.paymentURLs = append(sys.paymentURLs, pay)
		sys.proxyURLs = append(sys.proxyURLs, prx)
	}
	if o.RoleCPUs > 0 {
		return sys.capRoles(o)
	}
	return nil
}

// capRoles holds every payment-resource and proxy process to o.RoleCPUs,
// each in a control group of its own (removed by down).
func (sys *e2eSystem) capRoles(o E2EOptions) error {
	for _, name := range slices.Sorted(maps.Keys(sys.cpu.pids)) {
		if name != "payment" && name != "proxy" && !strings.HasPrefix(name, "payment-") && !strings.HasPrefix(name, "proxy-") {
			continue
		}
		g, err := cpucap.New(fmt.Sprintf("payouts-bench-%d-%s", os.Getpid(), name), o.RoleCPUs)
		if err != nil {
			return fmt.Errorf("bench e2e: --role-cpus: %w", err)
		}
		sys.caps = append(sys.caps, roleCap{name: name, g: g})
		if err := g.Add(sys.cpu.pids[name]); err != nil {
			return fmt.Errorf("bench e2e: --role-cpus: %s: %w", name, err)
		}
		o.Logger.Info("role limited", "process", name, "cpus", o.RoleCPUs, "cgroup", g.Dir())
	}
	return nil
}

// throttled is how long each limited process has been held back so far.
func (sys *e2eSystem) throttled() (map[string]time.Duration, error) {
	out := make(map[string]time.Duration, len(sys.caps))
	for _, c := range sys.caps {
		st, err := c.g.Stat()
		if err != nil {
			return nil, err
		}
		out[c.name] = st.ThrottledTime
	}
	return out, nil
}

func (sys *e2eSystem) startServer(ctx context.Context, name string, args ...string) (string, error) {
	c, err := sys.procs.startServer(name, args...)
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	addr, err := c.Addr(wctx)
	if err != nil {
		return "", err
	}
	url := "http://" + addr
	if err := c.Ready(wctx, nil, url); err != nil {
		return "", err
	}
	sys.cpu.add(name, c.Pid(), false)
	sys.logs[name] = c.Spec.Log
	return url, nil
}

func (sys *e2eSystem) down(log *slog.Logger) {
	sys.procs.stop(20 * time.Second)
	if sys.st != nil {
		if err := sys.st.Stop(); err != nil {
			log.Warn("stopping the stack", "error", err.Error())
		}
	}
	for _, c := range sys.caps {
		if err := c.g.Remove(); err != nil {
			log.Warn("removing a --role-cpus control group", "process", c.name, "cgroup", c.g.Dir(), "error", err.Error())
		}
	}
}

// writeSecretFile writes a database URL for a child to read (0600), so
// that no secret shows on a command line.
func writeSecretFile(dir, name, value string) (string, error) {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := splitFields(string(b))
	if len(f) < 3 {
		return ""
	}
	return f[0] + " " + f[1] + " " + f[2]
}

// railTimeout is every proxy's --rail-timeout.
func (o E2EOptions) railTimeout() time.Duration {
	if o.RailTimeout > 0 {
		return o.RailTimeout
	}
	return stack.DefaultRailTimeout
}
