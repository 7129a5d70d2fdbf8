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
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
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
)

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
	// service (the proxy's submission waits for the rail: see proxyclient).
	CallTimeout time.Duration

	LockURL    string
	PaymentURL string
	ProxyURL   string
	// Token is the executor's bearer token (the same for every service).
	Token string

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
	if c.Concurrency < 1 || c.Concurrency > 256 {
		return fmt.Errorf("executor: concurrency must be from 1 to 256, got %d", c.Concurrency)
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

	// base is the context of every call: it carries no cancellation, so a
	// stop request lets the current step finish instead of cutting it off
	// (an interrupted call is an unknown outcome).
	base     context.Context
	stopping atomic.Bool
	stopCh   chan struct{}
	stopOnce sync.Once

	mu     sync.Mutex
	active map[string]bool // accounts a worker is on
	// fencedOff holds accounts whose last grant was fenced out: a guard
	// stores a fence above the tokens the lock service now issues (a later
	// holder, or a rewound lock service). Retrying at once would only mint
	// tokens and fenced_out events, so the account waits, longer each time.
	fencedOff map[string]*cooldown
	// unreleased holds grants whose release failed (the lock service was
	// unreachable or restarting). The session stays alive, so such a key
	// would stay held for as long as this process runs, blocking every
	// other holder — an operator, the reconciler resolving an ambiguous
	// payout — whenever this executor has no further work there. Each poll
	// retries them until the release lands or the session is gone.
	unreleased map[string]grant
}

// New builds an executor from cfg.
func New(cfg Config) (*Executor, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	pay, err := paymentclient.New(cfg.PaymentURL, cfg.Token, httpx.WithTimeout(cfg.CallTimeout))
	if err != nil {
		return nil, fmt.Errorf("executor: --payment-url: %w", err)
	}
	proxy, err := proxyclient.New(cfg.ProxyURL, cfg.Token)
	if err != nil {
		return nil, fmt.Errorf("executor: --proxy-url: %w", err)
	}
	lk := cfg.locker
	if lk == nil {
		if lk, err = newLockService(cfg.LockURL, cfg.Token, cfg.SessionTTL, cfg.CallTimeout, cfg.Logger); err != nil {
			return nil, fmt.Errorf("executor: --lock-url: %w", err)
		}
	}
	e := &Executor{
		cfg: cfg, log: cfg.Logger, pay: pay, proxy: proxy, lock: lk,
		m: newMetrics(cfg.Registry), stopCh: make(chan struct{}), active: map[string]bool{}, fencedOff: map[string]*cooldown{}, unreleased: map[string]grant{},
	}
	return e, nil
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
		case <-e.stopCh:
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
		"session_ttl", e.cfg.SessionTTL.String(), "poll_interval", e.cfg.PollInterval.String())

	bo := backoff{min: 200 * time.Millisecond, max: 5 * time.Second}
	down := false
	for !e.stopping.Load() {
		cctx, cancel := e.callCtx()
		sess, err := e.lock.Open(cctx, e.cfg.Owner)
		cancel()
		if err != nil {
			// Fail closed: without a session there are no grants and no work.
			e.m.sessions.WithLabelValues("open_failed").Inc()
			e.m.lockDown.Set(1)
			if !down {
				e.log.Warn("lock service unreachable: doing nothing until it answers (fail closed)", obs.KeyError, err.Error())
				down = true
			} else {
				e.log.Debug("lock service still unreachable", obs.KeyError, err.Error())
			}
			if !e.sleep(bo.next()) {
				break
			}
			continue
		}
		bo.reset()
		if down {
			e.log.Info("lock service reachable again: resuming work")
			down = false
		}
		e.m.sessions.WithLabelValues("opened").Inc()
		e.m.lockDown.Set(0)
		log := e.log.With(obs.KeyHolder, sess.ID())
		log.Info("lock session opened", "owner", e.cfg.Owner)
		lost := e.runSession(sess, log)
		cctx, cancel = e.callCtx()
		cerr := sess.Close(cctx)
		cancel()
		switch {
		case lost:
			e.m.sessions.WithLabelValues("lost").Inc()
			e.m.lockDown.Set(1)
			log.Warn("lock session lost (client deadline passed): every grant is void; opening a new session")
		case cerr != nil:
			log.Warn("could not close the lock session; its locks expire with its TTL", obs.KeyError, cerr.Error())
		default:
			e.m.sessions.WithLabelValues("closed").Inc()
			log.Info("lock session closed: every lock released")
		}
	}
	e.log.Info("executor stopped")
	return nil
}

func (e *Executor) stop() {
	e.stopOnce.Do(func() {
		e.stopping.Store(true)
		close(e.stopCh)
	})
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
	case <-e.stopCh:
		return false
	}
}

// runSession dispatches accounts with work to workers until a stop is
// requested (false) or the session is lost (true). It returns once every
// worker has finished.
func (e *Executor) runSession(sess session, log *slog.Logger) (lost bool) {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		// Whatever this session still holds ends with it.
		e.mu.Lock()
		clear(e.unreleased)
		e.mu.Unlock()
	}()
	slots := make(chan struct{}, e.cfg.Concurrency)
	progress := make(chan struct{}, 1)
	jeopardy := false
	for {
		if e.stopping.Load() {
			return false
		}
		if sess.Lost() {
			return true
		}
		if !sess.Healthy() {
			// JEOPARDY: a keepalive failed; start nothing new.
			if !jeopardy {
				log.Warn("lock session in jeopardy (a keepalive failed): starting no new work")
				jeopardy = true
			}
		} else {
			if jeopardy {
				log.Info("lock session healthy again")
				jeopardy = false
			}
			e.retryReleases(log)
			e.dispatch(sess, log, slots, progress, &wg)
		}
		t := time.NewTimer(e.cfg.PollInterval)
		select {
		case <-e.stopCh:
		case <-progress:
		case <-t.C:
		}
		t.Stop()
	}
}

func (e *Executor) dispatch(sess session, log *slog.Logger, slots chan struct{}, progress chan struct{}, wg *sync.WaitGroup) {
	ctx, cancel := e.callCtx()
	items, err := e.pay.Work(ctx, e.cfg.Concurrency*4)
	cancel()
	if err != nil {
		log.Warn("could not ask the payment resource for work", obs.KeyError, err.Error())
		return
	}
	// Executors read the same list; starting at a random place spreads them
	// over the accounts instead of all contending for the first one.
	n := len(items)
	start := 0
	if n > 1 {
		start = rand.IntN(n)
	}
	for i := range n {
		it := items[(start+i)%n]
		if e.stopping.Load() || !sess.Healthy() {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			return // every worker is busy; the next poll continues
		}
		e.mu.Lock()
		busy := e.active[it.AccountID]
		if c := e.fencedOff[it.AccountID]; c != nil && time.Now().Before(c.until) {
			busy = true
		}
		if !busy {
			e.active[it.AccountID] = true
		}
		e.mu.Unlock()
		if busy {
			<-slots
			continue
		}
		wg.Add(1)
		go func(account string) {
			defer wg.Done()
			did, fenced := e.workAccount(sess, log, account)
			e.mu.Lock()
			delete(e.active, account)
			if fenced {
				c := e.fencedOff[account]
				if c == nil {
					c = &cooldown{b: backoff{min: time.Second, max: 30 * time.Second}}
					e.fencedOff[account] = c
				}
				wait := c.b.next()
				c.until = time.Now().Add(wait)
				log.Warn("account fenced out: leaving it alone for a while", obs.KeyAccountID, account, "retry_in", wait.String())
			} else if did {
				delete(e.fencedOff, account)
			}
			e.mu.Unlock()
			<-slots
			if did {
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}(it.AccountID)
	}
}
