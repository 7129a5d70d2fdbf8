// Package pgbackend is the lock service's PostgreSQL backend (lockdb).
//
// Every decision is one conditional SQL statement evaluated with the
// database's clock, never the lock server's (D-11): expiries are set from
// now(), and a session's liveness is judged by clock_timestamp(), when the
// statement judges it, however long its transaction waited before; tokens
// come from lock_token_seq, which is never reset (D-2); and the grant log is
// written in the same statement as the grant (D-9). Liveness of a session is
// defined once, by the SQL function lock_session_live, which also applies
// the grace period of D-12.
package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// notifyChannel carries the key of every lock that became free.
const notifyChannel = "payouts_lock_free"

// Config configures the backend.
type Config struct {
	DatabaseURL string
	Logger      *slog.Logger
	// ReapInterval is how often lapsed sessions are expired and the
	// database identity is checked (default 250ms).
	ReapInterval time.Duration
	// MaxConns bounds the pool (default 16).
	MaxConns int32
	// GrantRetention is how long an ended grant stays in the grant log
	// before compaction deletes it (0: forever).
	GrantRetention time.Duration
	// CompactInterval is how often compaction runs (default 1 minute).
	CompactInterval time.Duration
}

// Backend implements backend.Backend on PostgreSQL.
type Backend struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	mu       sync.Mutex
	observer backend.Observer // nil until SetObserver
	// unheard is a grace period that started before any observer was set
	// (Open's own, D-12): SetObserver delivers it, so the start is counted.
	unheard  *grace
	waiters  backend.Waiters
	listener *pgx.Conn // handed to Run's listen loop

	// Concurrent acquires of free keys, and concurrent releases, each go
	// to PostgreSQL as one statement (group commit).
	freeAcquires *batcher.Batcher[acquireReq, acquireRes]
	releases     *batcher.Batcher[releaseReq, releaseRes]
}

var _ backend.Backend = (*Backend)(nil)

// Open connects to lockdb. The schema must be migrated.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("pgbackend: database URL is required")
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 250 * time.Millisecond
	}
	if cfg.CompactInterval <= 0 {
		cfg.CompactInterval = time.Minute
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: parse database URL: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	// A grant is answered only after its commit is durable: with
	// asynchronous commit a crash could lose a committed nextval and the
	// sequence would issue the same token again (INV-04).
	maps.Copy(pc.ConnConfig.RuntimeParams, pgpool.DurableCommits())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: connect: %w", err)
	}
	b := &Backend{pool: pool, cfg: cfg, log: cfg.Logger}
	b.freeAcquires = batcher.New(b.acquireFreeBatch, b.batchOptions("acquire"))
	b.releases = batcher.New(b.releaseBatch, b.batchOptions("release"))
	if err := b.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: %w", err)
	}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('lock_epoch') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		pool.Close()
		return nil, errors.New("pgbackend: lockdb is not migrated (run payouts migrate --db lockdb, or start with --migrate)")
	}
	// D-12: the lock service is starting, so no client could renew while it
	// was away. Start the grace period before serving anything.
	if err := b.checkEpoch(ctx, true); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: %w", err)
	}
	// Listen before serving, so no release after Open goes unheard.
	if b.listener, err = b.startListening(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: listen: %w", err)
	}
	return b, nil
}

// batchOptions: one statement carries at most 64 acquires (or releases),
// and one statement of each kind runs at a time: at 32 clients that did
// best (two at a time did 10-15 % fewer pairs a second, four 40 % fewer).
// Each statement's size goes to the observer (op: acquire, release). A
// call whose caller has gone away before a statement took it is not made.
func (b *Backend) batchOptions(op string) batcher.Options {
	return batcher.Options{MaxBatch: 64, Parallel: 1, DropAbandoned: true, Observe: func(calls int) { b.obs().StoreBatch(op, calls) }}
}

// MaxConns is the size of the backend's connection pool.
func (b *Backend) MaxConns() int32 { return b.cfg.MaxConns }

// Name implements backend.Backend.
func (b *Backend) Name() string { return "postgres" }

// SetObserver implements backend.Backend.
func (b *Backend) SetObserver(o backend.Observer) {
	b.mu.Lock()
	b.observer = o
	g := b.unheard
	b.unheard = nil
	b.mu.Unlock()
	if g != nil {
		o.Grace(g.until, g.why)
	}
}

type grace struct {
	until time.Time
	why   string
}

// graceStarted tells the observer, or keeps the event for the first one.
func (b *Backend) graceStarted(until time.Time, why string) {
	b.mu.Lock()
	o := b.observer
	if o == nil {
		b.unheard = &grace{until, why}
	}
	b.mu.Unlock()
	if o != nil {
		o.Grace(until, why)
	}
}

func (b *Backend) obs() backend.Observer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.observer == nil {
		return backend.NopObserver{}
	}
	return b.observer
}

// Ping implements backend.Backend.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.pool.Ping(ctx); err != nil {
		return backend.Unavailable("ping", err)
	}
	return nil
}

// Close implements backend.Backend.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.listener != nil { // Run never started
		b.listener.Close(context.Background())
		b.listener = nil
	}
	b.mu.Unlock()
	// Statements in flight get their answers before the pool goes.
	b.freeAcquires.Wait()
	b.releases.Wait()
	b.pool.Close()
	return nil
}

// classify turns a database error into a problem: connection-level failures
// are unavailable (the effect of a commit in flight is unknown, which every
// caller of the lock service already handles), the rest internal.
func classifyErr(what string, err error) error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if errors.As(err, &p) {
		return p
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return problem.Wrap(problem.Unavailable, err, "%s: the lock store did not answer in time", what)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "57", "53": // connection exception, operator intervention (shutdown), resources
			return backend.Unavailable(what, err)
		}
		return problem.Wrap(problem.Internal, err, "%s failed", what)
	}
	// No PostgreSQL error: the connection failed.
	return backend.Unavailable(what, err)
}

// classify is classifyErr that also drops every pooled connection when the
// database was unreachable: after a restart or failover the idle ones are
// all dead, and each would otherwise fail one request.
func (b *Backend) classify(what string, err error) error {
	out := classifyErr(what, err)
	if problem.Has(out, problem.Unavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		b.pool.Reset()
	}
	return out
}

// retryable reports a serialization failure or deadlock: the statement had
// no effect and may run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
