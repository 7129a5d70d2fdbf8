// Package executor is the payout worker (`payouts run executor`): it holds
// one lock session, takes payout:{account} for accounts with work, and
// carries each grant's fencing token, as an explicit parameter, to both
// guards — the payment resource and the rail proxy.
//
// Safety comes from the guards, never from this process: the client-side
// grant check before each step only avoids work that would be fenced out.
// See docs/executor.md for the recovery table.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	"github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Role is the role name in logs and metrics.
const Role = "executor"

// Defaults of the command-line flags.
const (
	DefaultConcurrency  = 4
	DefaultSessionTTL   = 10 * time.Second
	DefaultPollInterval = time.Second
	DefaultCallTimeout  = 30 * time.Second
	// DefaultProxyTimeout is --proxy-timeout: the proxy client's own
	// timeout, as before the flag. A submission waits for the rail (a
	// batch of 50 is forwarded 16 rail calls at a time), so it must stay
	// well above the proxy's --rail-timeout: one cut short has no usable
	// answer and, while the proxy is still waiting for the rail, can end
	// RAIL_AMBIGUOUS where the rail's answer would have settled it.
	DefaultProxyTimeout = proxyclient.DefaultTimeout
	// DefaultShutdownGrace is --shutdown-grace: how long a stop waits for
	// submissions in flight at the proxy, inside the 30 s an orchestrator
	// typically gives before SIGKILL, leaving time to release and close.
	DefaultShutdownGrace = 20 * time.Second
	// DefaultGrantLinger is --grant-linger: how long a grant whose account
	// ran out of work is kept for the account's next round. It covers an
	// account's next round when a backlog over 1,000 accounts is paid at
	// about 1,000 payouts/s (a round every 7–8 s per account), which 5 s
	// did not: nearly every round then paid an acquire and a release
	// (docs/benchmarks-history.md, "A linger that covers the next round"). What
	// waits for a kept grant waits at most this much longer (an operator's
	// command waits 30 s by default; the reconciler tries a later pass).
	DefaultGrantLinger = 10 * time.Second
)

// MaxConcurrency bounds --concurrency.
const MaxConcurrency = 256

// maxGrantLinger bounds --grant-linger: a kept grant holds its account
// against every other holder (operators, the reconciler, other executors).
const maxGrantLinger = 30 * time.Second

// maxPayoutsPerGrant bounds the payouts one grant drives before the lock is
// given back, so a busy account cannot starve the others.
const maxPayoutsPerGrant = 50

// Config configures an executor.
type Config struct {
	// Owner names this executor in the lock service (and in logs).
	Owner string
	// Concurrency is how many accounts are worked on at once.
	Concurrency int
	// SessionTTL is the lock session's TTL; keepalives go every TTL/3.
	SessionTTL time.Duration
	// PollInterval is how often the payment resource is asked for work
	// when there was none.
	PollInterval time.Duration
	// CallTimeout bounds each call to the payment resource and the lock
	// service, and each lookup at the proxy (the proxy's submission waits
	// for the rail: ProxyTimeout).
	CallTimeout time.Duration
	// ProxyTimeout bounds each submission to the proxy, and every proxy
	// call; 0: DefaultProxyTimeout.
	ProxyTimeout time.Duration
	// ShutdownGrace is how long a stop waits for submissions in flight at
	// the proxy before it gives up on them (abandonInFlight); 0:
	// DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// GrantLinger is how long a grant is kept after a round that moved
	// payouts and left its account with nothing more to do, so that the
	// account's next payouts are driven under it without a lock-service
	// round trip (see linger.go). 0 releases it at once; the command line's
	// default is DefaultGrantLinger.
	GrantLinger time.Duration

	LockURL    string
	PaymentURL string
	ProxyURL   string
	// Token is the executor's bearer token (the same for every service).
	Token string
	// HTTPClient carries every call (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client

	// MetricsAddr, when not empty, serves /metrics and /healthz there.
	MetricsAddr string

	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Hooks are test hooks (HooksFromEnv; zero in production builds).
	Hooks Hooks

	// locker replaces the lock service client (package tests).
	locker locker
}

func (c *Config) defaults() error {
	if c.Owner == "" {
		return errors.New("executor: owner is required (--owner)")
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("executor: concurrency must be from 1 to %d, got %d", MaxConcurrency, c.Concurrency)
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.SessionTTL < time.Second || c.SessionTTL > 5*time.Minute {
		return fmt.Errorf("executor: session TTL must be from 1s to 5m, got %s", c.SessionTTL)
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.PollInterval < 10*time.Millisecond {
		return fmt.Errorf("executor: poll interval must be at least 10ms, got %s", c.PollInterval)
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.CallTimeout < 0 {
		return fmt.Errorf("executor: call timeout must be positive, got %s", c.CallTimeout)
	}
	if c.ProxyTimeout == 0 {
		c.ProxyTimeout = DefaultProxyTimeout
	}
	if c.ProxyTimeout < 0 {
		return fmt.Errorf("executor: proxy timeout (--proxy-timeout) must be positive, got %s", c.ProxyTimeout)
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("executor: shutdown grace (--shutdown-grace) must be positive, got %s", c.ShutdownGrace)
	}
	if c.GrantLinger < 0 || c.GrantLinger > maxGrantLinger {
		return fmt.Errorf("executor: grant linger (--grant-linger) must be from 0 (release at once) to %s, got %s", maxGrantLinger, c.GrantLinger)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = obs.NewRegistry()
	}
	return c.Hooks.check()
}

// Executor drives payouts. Create it with New, run it with Run.
type Executor struct {
	cfg   Config
	log   *slog.Logger
	pay   *paymentclient.Client
	proxy *proxyclient.Client
	lock  locker
	m     *metrics
	// rail stops claims while the rail gives no usable answer (railgate.go).
	rail railgate.Gate
	// workPayouts is GET /work's payouts as dispatch asks it: workPayouts,
	// or 0 once a payment resource older than that parameter refused it.
	// Only the poll loop reads and writes it.
	workPayouts int
	// workDown is the payment resource's outage as GET /work sees it:
	// while it lasts the asks back off (200 ms–5 s, and never more often
	// than the poll interval), and it is logged once, not on every poll.
	workDown outage
	// pauseSkip are the accounts GET /work listed with nothing but PENDING
	// payouts while claims are paused, left out of the asks until the
	// pause ends (dispatch). The poll loop's alone.
	pauseSkip map[string]bool

	// base is the context of every call: it carries no cancellation, so a
	// stop request lets the current step finish instead of cutting it off
	// (an interrupted call is an unknown outcome).
	base context.Context
	// stopped is done once a stop is requested (stop): loops and waits
	// that a stop ends at once select on it, and stopRequested reads it.
	stopped    context.Context
	stopCancel context.CancelFunc
	// abandoned is done once a stop has waited ShutdownGrace: submissions
	// still in flight at the proxy are then given up (abandonInFlight).
	abandoned context.Context
	abandon   context.CancelFunc
	// submitting counts the submissions in flight at the proxy, by payout.
	submitting map[string]int

	mu     sync.Mutex
	active map[string]bool // accounts a worker is on
	// cooling holds accounts whose last round took the lock and moved
	// nothing: fenced out (a guard stores a fence above the tokens the lock
	// service now issues), a payout the proxy refuses, a submission whose
	// fate is not known yet. Retrying at once would only mint tokens (and
	// fenced_out events, ERROR lines), so the account waits, longer each time.
	cooling map[string]*cooldown
	// fatal is set when a service refused this executor's token: nothing
	// will work until an operator fixes the credential, so Run ends with it.
	fatal error
	// unreleased holds grants whose release failed (the lock service was
	// unreachable or restarting). The session stays alive, so such a key
	// would stay held for as long as this process runs, blocking every
	// other holder — an operator, the reconciler resolving an ambiguous
	// payout — whenever this executor has no further work there. Each poll
	// retries them until the release lands or the session is gone.
	//
	// Kept grants whose linger has passed join it too, so every release
	// after a round goes through retryReleases.
	unreleased map[string]toRelease
	// releasing is set while startReleases' passes run.
	releasing bool
	// inRelease holds the accounts a release pass has reserved (they are
	// in active too), true once a dispatch found one so and left it: that
	// release then wakes the poll loop (wake), so that the account's
	// payout waits for the release only, not for the next poll.
	inRelease map[string]bool
	// wake is the poll loop's wake-up (runSession's), nil outside one.
	wake chan struct{}
	// kept holds grants kept after a round for the account's next one
	// (linger.go). An account is in at most one of kept and unreleased.
	kept map[string]keptGrant
	// keptDue is no later than the earliest end of a grant in kept, zero
	// when unknown: until then expireKept has nothing to do and does not
	// walk kept.
	keptDue time.Time
	// keptCap is how many grants kept may hold (maxKeptGrants).
	keptCap int
}

// New builds an executor from cfg.
func New(cfg Config) (*Executor, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pay, err := paymentclient.New(cfg.PaymentURL, cfg.Token, httpx.WithTimeout(cfg.CallTimeout), httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("executor: --payment-url: %w", err)
	}
	proxy, err := proxyclient.New(cfg.ProxyURL, cfg.Token, httpx.WithTimeout(cfg.ProxyTimeout), httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("executor: --proxy-url: %w", err)
	}
	lk := cfg.locker
	if lk == nil {
		if lk, err = newLockService(cfg.LockURL, cfg.Token, cfg.SessionTTL, cfg.CallTimeout, cfg.Logger, cfg.HTTPClient); err != nil {
			return nil, fmt.Errorf("executor: --lock-url: %w", err)
		}
	}
	e := &Executor{
		cfg: cfg, log: cfg.Logger, pay: pay, proxy: proxy, lock: lk,
		m: newMetrics(cfg.Registry), active: map[string]bool{}, cooling: map[string]*cooldown{},
		unreleased: map[string]toRelease{}, inRelease: map[string]bool{}, kept: map[string]keptGrant{}, keptCap: maxKeptGrants, workPayouts: workPayouts,
		workDown: outage{bo: backoff{min: 200 * time.Millisecond, max: 5 * time.Second}},
	}
	e.initStop()
	return e, nil
}

// initStop makes the stop request's contexts: stopped, and abandoned,
// done ShutdownGrace after it.
func (e *Executor) initStop() {
	e.stopped, e.stopCancel = context.WithCancel(context.Background())
	e.abandoned, e.abandon = context.WithCancel(context.Background())
	e.submitting = map[string]int{}
	context.AfterFunc(e.stopped, func() {
		time.AfterFunc(e.cfg.ShutdownGrace, e.abandonInFlight)
	})
}

// abandonInFlight gives up the submissions still in flight at the proxy
// once a stop has waited ShutdownGrace: past an orchestrator's grace
// period SIGKILL would leave every lock of the session held for its TTL.
// Each such payout is RAIL_SUBMITTED (D-4: recorded before the call), so
// whoever takes its account next asks the proxy before doing anything with
// it, and never sends it again on its own: the proxy forwards a payout at
// most once. A request given up may still reach the proxy; once a later
// holder has presented its token there it is fenced out.
func (e *Executor) abandonInFlight() {
	e.mu.Lock()
	var ids []string
	for id := range e.submitting {
		ids = append(ids, id)
	}
	e.mu.Unlock()
	if len(ids) > 0 {
		slices.Sort(ids)
		e.log.Warn("shutdown grace passed: giving up waiting for submissions in flight at the rail proxy; their outcome is not known here, and whoever takes their accounts next asks the proxy first (the payouts stay RAIL_SUBMITTED)",
			"payout_ids", ids, "shutdown_grace", e.cfg.ShutdownGrace.String())
	}
	e.abandon()
}

// proxyCtx bounds one submission to the proxy for payouts ids: the proxy
// timeout, or the end of the shutdown grace. It is not cancelled by the
// stop request itself.
func (e *Executor) proxyCtx(ids ...string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(e.base, e.cfg.ProxyTimeout)
	unhook := context.AfterFunc(e.abandoned, cancel)
	e.mu.Lock()
	for _, id := range ids {
		e.submitting[id]++
	}
	e.mu.Unlock()
	return ctx, func() {
		unhook()
		cancel()
		e.mu.Lock()
		for _, id := range ids {
			if e.submitting[id]--; e.submitting[id] <= 0 {
				delete(e.submitting, id)
			}
		}
		e.mu.Unlock()
	}
}

// Run works until ctx is cancelled, then stops gracefully: every worker
// finishes its current step, every lock is released, the session is closed.
// It serves metrics on cfg.MetricsAddr when set.
func Run(ctx context.Context, cfg Config) error {
	e, err := New(cfg)
	if err != nil {
		return err
	}
	if cfg.MetricsAddr == "" {
		return e.Run(ctx)
	}
	srv := httpx.NewServer(httpx.Config{Role: Role, Addr: cfg.MetricsAddr, Logger: e.log, Registry: cfg.Registry})
	addr, err := srv.Listen()
	if err != nil {
		return fmt.Errorf("executor: metrics: %w", err)
	}
	e.log.Info("metrics listening", "addr", addr.String())
	// The metrics server outlives the worker's drain so the drain is visible.
	mctx, stopMetrics := context.WithCancel(context.WithoutCancel(ctx))
	merr := make(chan error, 1)
	go func() { merr <- srv.Serve(mctx) }()
	werr := e.Run(ctx)
	stopMetrics()
	if err := <-merr; err != nil && werr == nil {
		werr = fmt.Errorf("executor: metrics: %w", err)
	}
	return werr
}

// Run is the executor's main loop (see the package Run).
func (e *Executor) Run(ctx context.Context) error {
	e.base = context.WithoutCancel(ctx)
	go func() {
		select {
		case <-ctx.Done():
			e.stop()
		case <-e.stopped.Done():
		}
	}()
	defer e.stop()
	if ig := ignoredHookEnv(); len(ig) > 0 && !hooksCompiledIn {
		e.log.Warn("test hook variables are set but this build ignores them (build with -tags crashpoints)", "variables", ig)
	}
	if e.cfg.Hooks != (Hooks{}) {
		e.log.Warn("TEST HOOKS ARMED: this executor will hold or crash on purpose; never run this in production",
			"hold_after", string(e.cfg.Hooks.HoldAfter), "crash_after", string(e.cfg.Hooks.CrashAfter))
	}
	e.log.Info("executor starting", "owner", e.cfg.Owner, "concurrency", e.cfg.Concurrency,
		"session_ttl", e.cfg.SessionTTL.String(), "poll_interval", e.cfg.PollInterval.String(), "grant_linger", e.cfg.GrantLinger.String())

	lockDown := outage{bo: backoff{min: 200 * time.Millisecond, max: 5 * time.Second}}
	// No session yet: nothing is done until one opens (a lock service that
	// hangs keeps Open waiting for --call-timeout).
	e.m.lockDown.Set(1)
	e.checkProxyRole()
	for !e.stopRequested() {
		cctx, cancel := e.callCtx()
		sess, err := e.lock.Open(cctx, e.cfg.Owner)
		cancel()
		if err != nil {
			if refusedToken(err) {
				e.refuse("lock service", e.cfg.LockURL, err)
				break
			}
			// Fail closed: without a session there are no grants and no work.
			e.m.sessions.WithLabelValues("open_failed").Inc()
			e.m.lockDown.Set(1)
			wait := lockDown.failed(e.log, "lock service unreachable: doing nothing until it answers (fail closed)", err)
			if !e.sleep(wait) {
				break
			}
			continue
		}
		lockDown.answered(e.log, "lock service reachable again: resuming work")
		e.m.sessions.WithLabelValues("opened").Inc()
		e.m.lockDown.Set(0)
		log := e.log.With(obs.KeyHolder, sess.ID())
		log.Info("lock session opened", "owner", e.cfg.Owner)
		lost := e.runSession(sess, log)
		if lost {
			// Said before the close, which waits up to --call-timeout on a
			// lock service that hangs.
			e.m.sessions.WithLabelValues("lost").Inc()
			e.m.lockDown.Set(1)
			log.Warn("lock session lost (client deadline passed): every grant is void; opening a new session")
		}
		cctx, cancel = e.callCtx()
		cerr := sess.Close(cctx)
		cancel()
		switch {
		case lost:
		case cerr != nil:
			log.Warn("could not close the lock session; its locks expire with its TTL", obs.KeyError, cerr.Error())
		default:
			e.m.sessions.WithLabelValues("closed").Inc()
			log.Info("lock session closed: every lock released")
		}
	}
	if err := e.fatalErr(); err != nil {
		e.log.Error("executor stopped: its token was refused", obs.KeyError, err.Error())
		return err
	}
	e.log.Info("executor stopped")
	return nil
}

// checkProxyRole asks the proxy, before anything is claimed, whether the
// executor's token may submit there. The payment resource lets an
// operator's token claim and mark payouts too, and only the proxy refuses
// it: with the wrong token the executor stopped only at its first
// submission, its payouts left RAIL_SUBMITTED for another executor to
// recover. A refusal stops it (exit 2) before it starts; a proxy that does
// not answer is logged and the executor goes on (it cannot pay until the
// proxy answers anyway).
func (e *Executor) checkProxyRole() {
	refusal, askErr := httpx.RoleRefusal(e.base, e.proxy.WhoAmI, func(id auth.Identity) bool { return id.Allows(auth.Executor) }, "submit")
	switch {
	case refusal != nil:
		e.refuse("rail proxy", e.cfg.ProxyURL, refusal)
	case askErr != nil:
		e.log.Warn("could not ask the rail proxy which role this token has; going on (a token of another role stops the executor at its first submission)", obs.KeyError, askErr.Error())
	}
}

// refusedToken reports a 401 or 403 answer: the service does not accept
// this executor's credential, and asking again will not change that.
var refusedToken = problem.RefusedToken

// refuse stops the executor for good: service at url refused its token.
// The first refusal is the one reported.
func (e *Executor) refuse(service, url string, err error) {
	e.mu.Lock()
	if e.fatal == nil {
		e.fatal = fmt.Errorf("executor: the %s at %s refused the token (%w): the executor needs a bearer token of role %q there (--token or --token-file)",
			service, url, err, Role)
	}
	e.mu.Unlock()
	e.stop()
}

func (e *Executor) fatalErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fatal
}

// stopRequested reports whether a stop was requested.
func (e *Executor) stopRequested() bool { return e.stopped.Err() != nil }

func (e *Executor) stop() {
	e.stopCancel()
}

// callCtx bounds one call. It is not cancelled by a stop request.
func (e *Executor) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.base, e.cfg.CallTimeout)
}

// sleep waits d; false when a stop was requested meanwhile.
func (e *Executor) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-e.stopped.Done():
		return false
	}
}
