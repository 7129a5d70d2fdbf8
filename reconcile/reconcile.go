// Package reconcile is the detective half of the design (`payouts
// reconcile`): it asserts after the fact, across the lock service, the
// payment resource, the rail proxy and the rail, what the guards are meant
// to make impossible (domain model 2.5), and resolves RAIL_AMBIGUOUS payouts
// from rail evidence, never from elapsed time (DESIGN D-6, D-8).
//
// It reads the other services only through their client packages, page by
// page. What it keeps in memory grows with the number of accounts, grants,
// in-flight payouts and findings, never with the number of payouts, ledger
// entries or rail payments: payouts, submissions and the settlement report
// are streamed in payout-id order and merged (payouts.go).
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Defaults of Options.
const (
	DefaultPageSize         = 500
	DefaultBulkPageSize     = 5000
	DefaultMaxFindings      = 1000
	DefaultSettlementWindow = 5 * time.Minute
	DefaultAmbiguitySLA     = 24 * time.Hour
	DefaultSessionTTL       = 15 * time.Second
	DefaultWorkers          = 8
	// DefaultLockWait is how long `payouts reconcile` waits for a held
	// account's lock, as `payouts payout cancel|abandon` do (--wait).
	DefaultLockWait = 30 * time.Second
)

// Options tune a Reconciler.
type Options struct {
	// SettlementWindow: an ambiguous payout is looked up at the rail only
	// once it has been ambiguous this long. The rail's own "final" flag
	// still decides; this only saves lookups that cannot be final yet.
	SettlementWindow time.Duration
	// AmbiguitySLA: an ambiguous payout older than this is reported for an
	// operator (ambiguous_over_sla).
	AmbiguitySLA time.Duration
	// Resolve turns ambiguity resolution on (the default in Run).
	Resolve bool
	// PageSize is the page size of every list read but the payout,
	// submission and settlement-report streams.
	PageSize int
	// BulkPageSize is the page size of the payout, submission,
	// settlement-report and ledger streams (at most wire.MaxBulkLimit).
	BulkPageSize int
	// MaxFindings caps how many findings a report lists (all are counted).
	MaxFindings int
	// RailPerPayout asks the rail about each payout's client reference
	// instead of reading its settlement report (a round trip per payout;
	// for a rail whose report this reconciler may not read). Payments
	// carrying a reference that belongs to no payout are then not seen.
	RailPerPayout bool
	// Workers is how many payouts are checked at once (a check is work on
	// the streamed pages, plus round trips for suspects read again and,
	// with RailPerPayout, the rail lookups).
	Workers int
	// Owner names the reconciler's lock session (logs, grant log).
	Owner string
	// LockWait is how long resolving an ambiguous payout waits for its
	// account's lock when another session holds it (0: not at all; the
	// payout is then left for a later pass). An executor keeps an
	// account's grant between its rounds, up to twice its grant linger
	// from the acquire, so a pass that does not wait may find a busy
	// account held every time. `payouts reconcile` waits DefaultLockWait.
	LockWait time.Duration
	// SessionTTL is the lock session's TTL while resolving.
	SessionTTL time.Duration
	// Logger receives the structured log; slog.Default when nil.
	Logger *slog.Logger
	// Now is the clock for ages (tests); time.Now when nil.
	Now func() time.Time
	// GrantRetention is the lock service's --grant-retention: how long it
	// keeps ended grants before compacting them away. A ledger entry or
	// submission written before then, less GrantClockSkew, may have lost
	// its grant to compaction and is not checked against the grant log
	// (INV-07); 0 checks every one, for a lock service that keeps them all.
	GrantRetention time.Duration
	// GrantLogLostThrough is the token the lock service was bumped to
	// after a restore (DESIGN D-13): its grant log lost the grants issued
	// between the backup and the restore, all at or below it. A ledger
	// entry or submission under such a token is counted in a note instead
	// of checked against the grant log (INV-07); 0 checks every one.
	GrantLogLostThrough fencing.Token
	// SafetyEventsAfter skips the safety events an earlier pass already
	// reported (ids at or below the cursor, per guard). The zero value
	// reports every event ever recorded.
	SafetyEventsAfter EventCursor
}

// EventCursor is a position in each guard's safety-event log: the id of
// the last event read at each, and when that event was recorded. A pass
// first reads that event again; if it is gone or is another event, the
// guard's log was rewound (its database restored from a backup, or failed
// over to a replica behind it), ids below the cursor are being given to new
// events, and the pass reads that guard's log from the start instead.
type EventCursor struct {
	Payment   int64     `json:"payment"`
	Proxy     int64     `json:"proxy"`
	PaymentAt time.Time `json:"payment_at,omitzero"`
	ProxyAt   time.Time `json:"proxy_at,omitzero"`
}

func (o *Options) defaults() {
	if o.SettlementWindow < 0 {
		o.SettlementWindow = 0
	}
	if o.LockWait < 0 {
		o.LockWait = 0
	}
	if o.AmbiguitySLA <= 0 {
		o.AmbiguitySLA = DefaultAmbiguitySLA
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.PageSize > 1000 {
		o.PageSize = 1000
	}
	if o.BulkPageSize <= 0 {
		o.BulkPageSize = DefaultBulkPageSize
	}
	o.BulkPageSize = min(o.BulkPageSize, wire.MaxBulkLimit)
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.MaxFindings <= 0 {
		o.MaxFindings = DefaultMaxFindings
	}
	if o.Owner == "" {
		o.Owner = "reconciler"
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = DefaultSessionTTL
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Clients are the services a Reconciler reads, each through its client
// package.
type Clients struct {
	Lock    LockService
	Payment *paymentclient.Client
	Proxy   *proxyclient.Client
	// Rail looks payments up by client reference (the reconciler role).
	Rail *railclient.Client
	// RailReport reads the rail's settlement report (an operator's
	// credential); nil: Rail. Given, a refusal of the report is a refused
	// credential (exit 2); as Rail, it means reading per payout.
	RailReport *railclient.Client
}

// Reconciler runs reconciliation passes.
type Reconciler struct {
	c    Clients
	opts Options
	log  *slog.Logger
}

// New returns a Reconciler over the given clients.
func New(c Clients, opts Options) (*Reconciler, error) {
	if c.Lock == nil || c.Payment == nil || c.Proxy == nil || c.Rail == nil {
		return nil, errors.New("reconcile: every client (lock, payment, proxy, rail) is required")
	}
	opts.defaults()
	if c.RailReport == nil {
		c.RailReport = c.Rail
	}
	return &Reconciler{c: c, opts: opts, log: opts.Logger}, nil
}

// ErrCannotRun wraps every error that stopped a pass before it could
// reach a verdict (exit code 2).
var ErrCannotRun = errors.New("reconcile: could not run")

func cannotRun(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrCannotRun, what, err)
}

// Pass runs one reconciliation: ambiguity resolution first (when enabled),
// then every check. A nil error means the report is complete; an error
// wraps ErrCannotRun and the report must not be trusted as clean. The
// report then holds what the pass found before it stopped; Complete says
// whether every check ran (only the resolution of some ambiguous payouts
// failed).
func (r *Reconciler) Pass(ctx context.Context) (*Report, error) {
	rep := newReport(r.opts.MaxFindings)
	// A key this reconciler failed to release would keep every executor
	// off the account; give it back before anything else.
	if n, err := r.c.Lock.RetryReleases(ctx); n > 0 {
		r.log.Warn("lock releases still not acknowledged; retrying on the next pass", "pending", n, obs.KeyError, errText(err))
	}
	var incomplete error
	if r.opts.Resolve {
		if err := r.resolveAmbiguous(ctx, rep); err != nil {
			if !errors.Is(err, errResolutionIncomplete) {
				return rep, err
			}
			incomplete = err
		}
	}
	if err := r.check(ctx, rep); err != nil {
		rep.sort()
		return rep, err
	}
	rep.sort()
	rep.checked = true
	return rep, incomplete
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// isNotFound reports a not_found problem answer.
func isNotFound(err error) bool { return problem.Has(err, problem.NotFound) }

// isForbidden reports a forbidden problem answer.
func isForbidden(err error) bool { return problem.Has(err, problem.Forbidden) }

// Key of an account's lock (DESIGN D-3).
func lockKey(accountID string) string { return fencing.Key(accountID) }
