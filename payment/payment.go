// Package payment is the payment resource (`payouts serve payment`): the
// accounts, payouts and double-entry ledger in paydb, and guard 1 — every
// mutation advances the account's fence in one conditional statement before
// it does anything else (DESIGN D-1). Other roles talk to it only through
// payment/paymentclient.
package payment

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/payouts/payouts/internal/batcher"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Role is the role name in logs and metrics.
const Role = "payment"

// DefaultCurrency is the currency used when none is configured.
const DefaultCurrency = "EUR"

// Config configures the payment resource.
type Config struct {
	Addr        string // listen address (Run only)
	DatabaseURL string // paydb, migrated
	Currency    string // the one currency (ISO 4217 code); default EUR
	Logger      *slog.Logger
	Registry    *prometheus.Registry
	Auth        *auth.Authenticator // Run only
	TLS         *tls.Config         // Run only: serve HTTPS (nil: plain HTTP)
	// LedgerCheckInterval is how often the continuous INV-03 check runs
	// (default 30s).
	LedgerCheckInterval time.Duration
	// MaxConns bounds the database pool (default pgpool.DefaultMaxConns).
	MaxConns int32
	// ResolutionSLA is how long a payout must have been RAIL_AMBIGUOUS
	// before an operator may abandon it (domain model 2.3: "resolution SLA
	// exceeded"); default DefaultResolutionSLA.
	ResolutionSLA time.Duration
}

// DefaultResolutionSLA is the resolution SLA when none is configured (the
// reconciler's default --ambiguity-sla).
const DefaultResolutionSLA = 24 * time.Hour

// Service is the payment resource over one paydb.
type Service struct {
	pool     *pgxpool.Pool
	currency string
	log      *slog.Logger
	m        *metrics
	interval time.Duration
	sla      time.Duration // resolution SLA (abandon)
	// creates batches concurrent payout creations into one statement each
	// (createPayouts).
	creates *batcher.Batcher[createRequest, createAnswer]
	// workCreated wakes GET /v1/work calls waiting for work (workwait.go) when
	// this process creates a payout or makes one actionable again, or
	// another process says it did (workArrived, listenForWork).
	workCreated workSignal
	// onWorkWait, when set (tests only), runs each time a waiting GET
	// /v1/work call has found no work and starts to wait.
	onWorkWait atomic.Pointer[func()]
	// stopped is done once the service stops (stop): a draining server
	// answers the calls waiting for work at once, and a running recount
	// of payouts by state ends.
	stopped context.Context
	stop    context.CancelFunc
	// announce tells the other processes on this paydb of created
	// payouts (worknotify.go).
	announce announcer

	// afterRefusal, when set (tests only), runs after a refused mutation's
	// transaction has ended and before its evidence is recorded.
	afterRefusal atomic.Pointer[func()]
	// checkLedger, when set (tests only), stands in for CheckLedger in
	// RunLedgerCheck.
	checkLedger func(ctx context.Context, since time.Time, extraAccounts, extraGroups []string) (LedgerReport, error)

	// states serves payouts_payment_payouts and its companions
	// (collector_states.go).
	states *stateCollector
}

// New connects to paydb and creates the system accounts (funding and
// payout-clearing) if they are absent.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Currency == "" {
		cfg.Currency = DefaultCurrency
	}
	if !wire.CurrencyPattern.MatchString(cfg.Currency) {
		return nil, fmt.Errorf("payment: currency %q is not a three-letter upper-case ISO 4217 code", cfg.Currency)
	}
	if cfg.DatabaseURL == "" {
		return nil, errors.New("payment: a database URL is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	if cfg.LedgerCheckInterval <= 0 {
		cfg.LedgerCheckInterval = 30 * time.Second
	}
	if cfg.ResolutionSLA < 0 {
		return nil, fmt.Errorf("payment: resolution SLA %s is negative", cfg.ResolutionSLA)
	}
	if cfg.ResolutionSLA == 0 {
		cfg.ResolutionSLA = DefaultResolutionSLA
	}
	pool, err := pgpool.New(ctx, "payment: paydb", cfg.DatabaseURL, pgpool.Options{MaxConns: cfg.MaxConns, RuntimeParams: pgpool.DurableCommits()})
	if err != nil {
		return nil, err
	}
	s := &Service{pool: pool, currency: cfg.Currency, log: cfg.Logger, m: newMetrics(cfg.Registry), interval: cfg.LedgerCheckInterval, sla: cfg.ResolutionSLA}
	s.stopped, s.stop = context.WithCancel(context.Background())
	s.announce.pool = pool
	s.announce.failing = obs.NewOutage(s.log)
	s.creates = batcher.New(s.createPayouts, batcher.Options{
		MaxBatch: maxCreateBatch, Parallel: createBatchesInFlight, Timeout: createTimeout,
		Observe: func(n int) { s.m.createBatch.Observe(float64(n)) },
	})
	if err := s.ensureSystemAccounts(ctx); err != nil {
		s.stop()
		pool.Close()
		return nil, err
	}
	s.states = newStateCollector(pool, s.log, s.sla, s.stopped)
	cfg.Registry.MustRegister(s.states)
	if !guardEnabled {
		s.log.Error("NEGATIVE-CONTROL BUILD: guard 1's fence condition is compiled out; stale tokens are accepted. Never run this build in production.")
	}
	return s, nil
}

// Close releases the database pool.
func (s *Service) Close() {
	s.creates.Wait()
	s.announce.wg.Wait()
	s.stop()
	s.pool.Close()
}

// Payout creations are written in batches (createPayoutsSQL): at most
// maxCreateBatch payouts per statement, createBatchesInFlight statements
// at once, each bounded by createTimeout.
const (
	maxCreateBatch        = 256
	createBatchesInFlight = 2
	createTimeout         = 30 * time.Second
)

// Currency is the configured currency.
func (s *Service) Currency() string { return s.currency }

// Ping checks the database (readiness).
func (s *Service) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

func (s *Service) ensureSystemAccounts(ctx context.Context) error {
	for _, id := range []string{pc.FundingAccount, pc.ClearingAccount} {
		if _, err := s.pool.Exec(ctx, insertAccountSQL, id, s.currency, 0); err != nil {
			return fmt.Errorf("payment: create system account %s: %w", id, err)
		}
		var cur string
		if err := s.pool.QueryRow(ctx, `SELECT currency FROM account WHERE id = $1`, id).Scan(&cur); err != nil {
			return fmt.Errorf("payment: read system account %s: %w", id, err)
		}
		if cur != s.currency {
			return fmt.Errorf("payment: this database holds %s accounts but the service is configured for %s (--currency)", cur, s.currency)
		}
	}
	return nil
}

// Run serves the payment resource on cfg.Addr until ctx is done, with the
// continuous ledger check running beside it.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	svc, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer svc.Close()
	srv := httpx.NewServer(httpx.Config{
		Role: Role, Addr: cfg.Addr, Logger: svc.log, Registry: cfg.Registry, Auth: cfg.Auth,
		Ready: []httpx.Check{svc.Ping}, TLS: cfg.TLS,
	})
	svc.Mount(srv.Router())
	if _, err := srv.Listen(); err != nil {
		return err
	}
	// Calls waiting for work are answered as the server starts draining.
	defer context.AfterFunc(ctx, svc.stop)()
	var g httpx.Group
	g.Add(srv.Serve)
	g.Add(svc.RunLedgerCheck)
	g.Add(svc.listenForWork)
	return g.Run(ctx)
}
