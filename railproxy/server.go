// Package railproxy is the rail proxy (`payouts serve proxy`): the second,
// independent fencing guard, and the only one that would remain if the
// payment resource could not be modified (domain model 2.6 step 7).
//
// A submission is accepted in one transaction whose first statement
// advances the account's high-water mark conditionally (DESIGN D-1) and
// whose second writes the intent row (FR-19) under a partial unique index
// that allows one forwarded submission per payout, ever (D-5, INV-02). Only
// after that commit is the rail called, once, with the payout's stable
// client reference; the outcome is recorded once and never retried. A
// timeout, a connection failure, a 5xx or an answer that cannot be read is
// TIMEOUT: money may have moved, and only a lookup can tell (D-6).
package railproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Config configures the proxy.
type Config struct {
	Addr        string
	Logger      *slog.Logger
	Registry    *prometheus.Registry
	Auth        *auth.Authenticator
	TLS         *tls.Config // serve HTTPS (nil: plain HTTP)
	DatabaseURL string      // proxydb, migrated
	RailURL     string
	RailToken   string // bearer sent to the rail
	// HTTPClient carries the rail calls (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client
	// RailTimeout bounds the one rail call of a submission; past it the
	// outcome is TIMEOUT. Default 10s.
	RailTimeout time.Duration
	// SendWindow bounds how long after its intent's transaction began a
	// submission's rail call may start; one that cannot start by then is
	// not sent (REJECTED not_forwarded_in_time). Default: six waves of rail
	// calls, each running to the rail timeout, ahead of the last of a full
	// batch, and one for the intent's transaction (defaultSendWindow).
	SendWindow time.Duration
	// RequestTimeout is the per-request deadline of the HTTP API (default
	// 30s). A submission whose rail call outlives it is still finished and
	// recorded.
	RequestTimeout time.Duration

	// crashPoint makes the process exit at that point (tests only; set by
	// this package's tests or, with -tags crashpoints, from the environment).
	crashPoint string
	// beforeRailCall runs just before a submission's rail call (tests
	// only: a stall there).
	beforeRailCall func()
	// now is the rail pause's clock (tests only; default time.Now).
	now func() time.Time
	// shutdownGrace is the HTTP server's grace for in-flight requests at
	// shutdown (tests only; default httpx's).
	shutdownGrace time.Duration
	// outcomeAttemptTimeout bounds each attempt to record a rail answer
	// (tests only; default dbTimeout, which also bounds each group's
	// statement).
	outcomeAttemptTimeout time.Duration
}

// Crash points (test builds only): see crashpoint_on.go.
const (
	CrashAfterIntent     = "after_intent"
	CrashAfterRailAnswer = "after_rail_answer"
)

// Server is the rail proxy.
type Server struct {
	cfg  Config
	log  *slog.Logger
	st   *store
	pool *pgxpool.Pool
	rail *railclient.Client
	http *httpx.Server
	m    *metrics

	// gate stops forwarding new submissions while the rail gives no
	// usable answer (pause.go); its clock is cfg.now.
	gate railgate.Gate

	// forwards counts the submissions being handled past their decoding
	// and the rail calls they start, detached from their callers; closing,
	// set when shutdown waits for them (at closedAt), refuses new ones
	// (enter).
	fmu      sync.Mutex
	closing  bool
	closedAt time.Time
	forwards sync.WaitGroup
	inflight sync.Map // payout id -> struct{} while its rail call runs

	// afterRefusal, when set (tests only), runs after a fenced-out
	// submission's transaction has ended and before its evidence is recorded.
	afterRefusal atomic.Pointer[func()]
}

// defaultSendWindow: a batch of MaxBatchItems runs in waves of
// maxBatchForwards calls; its last wave starts once the waves before it
// have ended, each within the rail timeout. One wave more covers the
// intent's transaction itself.
func defaultSendWindow(railTimeout time.Duration) time.Duration {
	waves := (proxyclient.MaxBatchItems + maxBatchForwards - 1) / maxBatchForwards
	return time.Duration(waves) * railTimeout
}

// resolvableAge is the age past which a submission without outcome has no
// rail call running any more: any call started within the send window and
// has ended within the rail timeout after that. Only then may a lookup
// record a resolution for it, or /metrics count it as stuck.
func (s *Server) resolvableAge() time.Duration { return s.cfg.SendWindow + s.cfg.RailTimeout }

// New connects to proxydb and builds the proxy. Close releases the pool.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	if cfg.RailTimeout == 0 {
		cfg.RailTimeout = 10 * time.Second
	}
	if cfg.RailTimeout < 0 {
		return nil, fmt.Errorf("railproxy: rail timeout %s is negative", cfg.RailTimeout)
	}
	if cfg.SendWindow == 0 {
		cfg.SendWindow = defaultSendWindow(cfg.RailTimeout)
	}
	if cfg.SendWindow < 0 {
		return nil, fmt.Errorf("railproxy: send window %s is negative", cfg.SendWindow)
	}
	if cfg.crashPoint == "" {
		cfg.crashPoint = crashPointFromEnv()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.outcomeAttemptTimeout <= 0 {
		cfg.outcomeAttemptTimeout = dbTimeout
	}
	switch cfg.crashPoint {
	case "", CrashAfterIntent, CrashAfterRailAnswer:
	default:
		return nil, fmt.Errorf("railproxy: unknown crash point %q (want %s or %s)", cfg.crashPoint, CrashAfterIntent, CrashAfterRailAnswer)
	}
	if cfg.RailURL == "" {
		return nil, errors.New("railproxy: the rail URL is required (--rail-url)")
	}
	rail, err := railclient.New(cfg.RailURL, cfg.RailToken, httpx.WithTimeout(cfg.RailTimeout), httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("railproxy: rail: %w", err)
	}
	pool, err := pgpool.New(ctx, "railproxy: proxydb", cfg.DatabaseURL, pgpool.Options{RuntimeParams: pgpool.DurableCommits()})
	if err != nil {
		return nil, err
	}
	m := newMetrics(cfg.Registry)
	st := newStore(pool, func(n int) { m.outcomeGroup.Observe(float64(n)) })
	s := &Server{cfg: cfg, log: cfg.Logger, pool: pool, st: st, rail: rail, m: m}
	st.resolvable = s.resolvableAge()
	cfg.Registry.MustRegister(newUnresolvedCollector(s.st, s.resolvableAge(), cfg.Logger))
	s.http = httpx.NewServer(httpx.Config{
		Role: "proxy", Addr: cfg.Addr, Logger: cfg.Logger, Registry: cfg.Registry, Auth: cfg.Auth,
		RequestTimeout: cfg.RequestTimeout, ShutdownTimeout: cfg.shutdownGrace,
		Ready: []httpx.Check{func(ctx context.Context) error { return pool.Ping(ctx) }},
		TLS:   cfg.TLS,
	})
	s.routes(s.http.Router())
	if !guardEnabled {
		s.log.Error("NEGATIVE CONTROL BUILD: the proxy's fence condition is compiled out; stale tokens are accepted. Never run this in production.")
	}
	if cfg.crashPoint != "" {
		s.log.Warn("crash point armed: the proxy will exit with status 3", "crash_point", cfg.crashPoint)
	}
	return s, nil
}

// Run serves the proxy until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen binds the listen address.
func (s *Server) Listen() (net.Addr, error) { return s.http.Listen() }

// Serve serves until ctx is done, then drains requests and waits for every
// detached rail call to finish and be recorded.
func (s *Server) Serve(ctx context.Context) error {
	err := s.http.Serve(ctx)
	s.drain()
	return err
}

// enter counts a submission in for the shutdown to wait for, unless the
// shutdown has begun (false: it must write and forward nothing). A handler
// the HTTP server's grace did not wait for is still waited for here, with
// every rail call it starts: the process never exits between a committed
// intent and its forward, nor during a rail call.
func (s *Server) enter() bool {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.closing {
		return false
	}
	s.forwards.Add(1)
	return true
}

// drain refuses new submissions and waits for those entered and their rail
// calls.
func (s *Server) drain() {
	s.fmu.Lock()
	if !s.closing {
		s.closing, s.closedAt = true, time.Now()
	}
	s.fmu.Unlock()
	s.forwards.Wait()
}

// closingSince reports whether the shutdown has begun, and since when.
func (s *Server) closingSince() (bool, time.Time) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.closing, s.closedAt
}

// shuttingDown is the answer to a submission that arrives once the
// shutdown has begun: nothing was recorded or forwarded.
func shuttingDown() error {
	return problem.New(problem.Unavailable, "the proxy is shutting down: the submission was not recorded or forwarded; submit it to another proxy or later").
		With(proxyclient.ForwardedExtension, false).With(proxyclient.ShuttingDownExtension, true)
}

// Handler is the full HTTP handler.
func (s *Server) Handler() http.Handler { return s.http.Handler() }

// Close waits for detached rail calls and closes the database pool.
func (s *Server) Close() {
	s.drain()
	s.st.outcomes.Wait()
	s.pool.Close()
}

func (s *Server) routes(r chi.Router) {
	readers := auth.Require(auth.Callers...)
	r.Route("/v1", func(r chi.Router) {
		// Only an executor, holding the account's grant, submits: any other
		// role could pay through the proxy or push an account's high-water
		// mark out of every executor's reach.
		r.With(auth.Require(auth.Executor)).Post("/submissions", httpx.Handler(s.submit))
		r.With(auth.Require(auth.Executor)).Post("/accounts/{id}/submissions", httpx.Handler(s.submitBatch))
		r.With(auth.Require(auth.Reconciler, auth.Operator)).Post("/submissions/{payout_id}/lookup", httpx.Handler(s.lookup))
		r.Group(func(r chi.Router) {
			r.Use(readers)
			r.Get("/submissions", httpx.PagedByID(wire.ParseLimit, s.st.list, func(r proxyclient.Record) int64 { return r.ID }))
			r.Get("/submissions/{payout_id}", httpx.Handler(s.get))
			r.Get("/submission-digests", httpx.Handler(s.submissionDigestsHandler))
			r.Get("/submission-order", httpx.PagedByID(wire.ParseBulkLimit, s.st.submissionOrder, func(o proxyclient.SubmissionOrder) int64 { return o.ID }))
			r.Get("/safety-events", httpx.PagedByID(wire.ParseLimit, s.st.safetyEvents, func(e proxyclient.SafetyEvent) int64 { return e.ID }))
			r.Get("/fences/high", httpx.Handler(s.highFence))
			r.Get("/high-water", httpx.Handler(s.highWater))
		})
	})
}

func (s *Server) crash(log *slog.Logger, point string) {
	if s.cfg.crashPoint == point {
		log.Error("crash point reached: exiting", "crash_point", point)
		os.Exit(3)
	}
}
