// Package backend defines what the lock service needs from its store: one
// interface, implemented on PostgreSQL (lock/pgbackend) and on etcd
// (lock/etcdbackend), and held to one behavioural suite (backendtest).
//
// Every decision about expiry and ordering is the store's: the service
// keeps no state of its own, so two service processes on one store behave
// as one service.
package backend

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
)

// DefaultGrantRetention is how long `payouts serve lock` keeps ended grants
// in the grant log by default (--grant-retention), and the window
// `payouts reconcile` checks writes against it by default.
const DefaultGrantRetention = 7 * 24 * time.Hour

// Limits on caller input (DESIGN §4, issue "Bad input").
const (
	MinTTL      = time.Second
	MaxTTL      = 5 * time.Minute
	MaxWait     = 5 * time.Minute
	MaxOwnerLen = 200
	MaxKeyLen   = 256
	MaxReason   = 1000
)

// Session states (DESIGN §4). SUSPECT is computed: a heartbeat is overdue
// (more than half the TTL since the last one) but the session has not expired.
const (
	StateActive  = "ACTIVE"
	StateSuspect = "SUSPECT"
	StateExpired = "EXPIRED"
	StateClosed  = "CLOSED"
)

// How a grant ended (D-9).
const (
	EndReleased = "released"
	EndExpired  = "expired"
	EndRevoked  = "revoked"
)

// Session is one client's liveness relationship with the service.
type Session struct {
	ID    string
	Owner string
	// Principal is the authenticated caller that opened the session (the
	// auth token's name): only it may use or close the session.
	Principal       string
	TTL             time.Duration
	State           string
	CreatedAt       time.Time
	LastHeartbeatAt time.Time
	ExpiresAt       time.Time
}

// Grant is a held lock as returned to the acquirer.
type Grant struct {
	Key          string
	Owner        string
	Token        fencing.Token
	SessionID    string
	ServerExpiry time.Time
	// Existing is true for an idempotent re-acquire (nothing was minted).
	Existing bool
}

// Lock is the introspection view of one key (never a correctness input).
type Lock struct {
	Key          string
	Held         bool
	Owner        string
	SessionID    string
	Token        fencing.Token
	AcquiredAt   time.Time
	ServerExpiry time.Time
}

// GrantRecord is one entry of the grant log (D-9).
type GrantRecord struct {
	Token     fencing.Token
	Key       string
	Owner     string
	SessionID string
	GrantedAt time.Time
	EndedAt   *time.Time
	EndReason string
	Actor     string
	Reason    string
	// Waited, on a grant ended by Release or Revoke, says that an acquire
	// was waiting for the key, on this lock-service process or another,
	// when the grant ended (best effort: it may be false for a waiter that
	// began just before the end, and true for one that has given up:
	// PostgreSQL keeps the grant's contended mark until the grant ends).
	Waited bool
}

// Backend is a lock store. Errors are *problem.Error with these codes:
// session_expired (unknown, expired or closed session), lock_held, not_held,
// not_found, unavailable (store unreachable); anything else is internal.
type Backend interface {
	// Name is "postgres" or "etcd" (the metrics label).
	Name() string
	// CreateSession starts a session for owner, owned by principal; the
	// store may round ttl up (etcd leases are whole seconds) and reports the
	// TTL it applies.
	CreateSession(ctx context.Context, owner, principal string, ttl time.Duration) (Session, error)
	// KeepAlive extends a live session from the store's now. It never
	// brings back an expired or closed session (session_expired).
	KeepAlive(ctx context.Context, id string) (Session, error)
	// CloseSession ends a session and releases all its locks (their grants
	// end as released). Closing a closed session is a no-op;
	// an expired or unknown one is session_expired.
	CloseSession(ctx context.Context, id string) (Session, error)
	// Session reads a session, in whatever state (not_found when unknown).
	Session(ctx context.Context, id string) (Session, error)
	// Acquire grants key to the session if it is free, in one atomic step
	// that also writes the grant record; re-acquire by the holding session
	// returns the same token. lock_held (with the holder as the "holder"
	// extension) when another live session holds it.
	Acquire(ctx context.Context, key, sessionID string) (Grant, error)
	// Release is compare-and-delete on (key, session, token): not_held
	// unless that exact grant is current.
	Release(ctx context.Context, key, sessionID string, token fencing.Token) (GrantRecord, error)
	// Revoke frees key whoever holds it and ends the grant as revoked by
	// actor with reason (not_held when the key is free).
	Revoke(ctx context.Context, key, actor, reason string) (GrantRecord, error)
	// Lock and Locks are introspection.
	Lock(ctx context.Context, key string) (Lock, error)
	Locks(ctx context.Context, prefix string, limit int) ([]Lock, error)
	// Grants pages the grant log in token order, tokens > after.
	Grants(ctx context.Context, after fencing.Token, limit int) ([]GrantRecord, error)
	// HighToken is at least every token ever issued, and every future
	// token is above it (0 before the first): PostgreSQL's token sequence
	// position, etcd's revision.
	HighToken(ctx context.Context) (fencing.Token, error)
	// Changed returns a channel that is signalled (best effort) when key may
	// have become free, until cancel is called. Waiting acquires also retry
	// on a timer, so a lost signal only costs latency.
	Changed(key string) (ch <-chan struct{}, cancel func())
	// Waiting tells the store, for every lock-service process to see, that
	// sessionID waits for key until done is called (or, should done be
	// lost, until until), so that an end of the key's grant reports
	// Waited. Best effort: an error only loses that.
	Waiting(ctx context.Context, key, sessionID string, until time.Time) (done func())
	// Run does the store's background work (reaping expired sessions,
	// recording grants ended by expiry, failover detection) until ctx ends.
	Run(ctx context.Context) error
	// Events delivers what Run observed, for metrics and logs.
	SetObserver(o Observer)
	// Ping checks the store is reachable (readiness).
	Ping(ctx context.Context) error
	Close() error
}

// Observer is told about things the backend did in the background.
type Observer interface {
	// Expired reports grants ended because their session expired.
	Expired(grants []GrantRecord)
	// Grace reports that a grace period started (D-12) and why.
	Grace(until time.Time, why string)
	// ActiveSessions reports the current number of live sessions.
	ActiveSessions(n int)
	// StoreSize reports the store's size and the size at which it refuses
	// every write (etcd: its database file and --quota-backend-bytes).
	// Backends whose store has no such limit do not call it.
	StoreSize(bytes, quota int64)
	// StoreBatch reports how many calls (op: acquire, release) one store
	// statement or transaction carried. Backends that do not group calls
	// do not call it.
	StoreBatch(op string, calls int)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) Expired([]GrantRecord)   {}
func (NopObserver) Grace(time.Time, string) {}
func (NopObserver) ActiveSessions(int)      {}
func (NopObserver) StoreSize(int64, int64)  {}
func (NopObserver) StoreBatch(string, int)  {}

var keyRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:._@+=-]*$`)

// CheckKey validates a lock key: 1..256 characters, starting with a letter
// or digit, then letters, digits and : . _ @ + = -.
//
// Its refusals name the field key (the path's {key}), as every refusal of
// this package names the field it is about (the problem's field member).
func CheckKey(key string) error {
	if key == "" {
		return wire.BadField("key", "the lock key is empty")
	}
	if len(key) > MaxKeyLen {
		return wire.BadField("key", "the lock key is longer than %d characters", MaxKeyLen)
	}
	if !keyRE.MatchString(key) {
		return wire.BadField("key", "the lock key %q is malformed: want a letter or digit, then letters, digits and : . _ @ + = - (e.g. payout:acc-1)", key)
	}
	return nil
}

// CheckPrefix validates a key prefix for listing (may be empty).
func CheckPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if len(prefix) > MaxKeyLen || !keyRE.MatchString(prefix) {
		return wire.BadField("prefix", "%q is not the beginning of a valid lock key", prefix)
	}
	return nil
}

// CheckTTL validates a session TTL given in milliseconds (ttl_ms), before
// any conversion: a huge value must not wrap around into the range.
func CheckTTL(ms int64) (time.Duration, error) {
	if ms < MinTTL.Milliseconds() || ms > MaxTTL.Milliseconds() {
		return 0, wire.BadField("ttl_ms", "must be between %d and %d, got %d", MinTTL.Milliseconds(), MaxTTL.Milliseconds(), ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// CheckWait validates how long an acquire may wait, in milliseconds
// (wait_ms; 0 answers at once), before any conversion.
func CheckWait(ms int64) (time.Duration, error) {
	if ms < 0 || ms > MaxWait.Milliseconds() {
		return 0, wire.BadField("wait_ms", "must be between 0 and %d, got %d", MaxWait.Milliseconds(), ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// CheckOwner validates a session owner: a one-line name operators read in
// lock listings, lock_held answers and logs, checked as every role checks
// such a name (no blank, no control or format character: a C1 control, a
// right-to-left override or a zero-width space makes one name read as
// another; no invalid UTF-8, which JSON decoding turns into U+FFFD).
func CheckOwner(owner string) error {
	return wire.ValidText("owner", owner, MaxOwnerLen, true, true)
}

// CheckSessionID validates the shape of a session id (it is then looked
// up), in a body's session_id or the path's {id} of /sessions/{id}: either
// way the field named is session_id.
func CheckSessionID(id string) error {
	if id == "" {
		return wire.BadField("session_id", "required")
	}
	if len(id) > 64 || !keyRE.MatchString(id) {
		return wire.BadField("session_id", "%q is malformed", id)
	}
	return nil
}

// ErrSessionGone is the session_expired error for id.
func ErrSessionGone(id string) error {
	return problem.New(problem.SessionExpired, "session %s does not exist, has expired or was closed; open a new session", id)
}

// ErrHeld is the lock_held error for key held by holder.
func ErrHeld(key string, holder Lock) error {
	e := problem.New(problem.LockHeld, "lock %s is held by another session", key)
	e.Key = key
	if holder.Held {
		e = e.With("holder", holder.Owner).With("holder_session_id", holder.SessionID)
		if !holder.ServerExpiry.IsZero() {
			e = e.With("server_expiry", holder.ServerExpiry.UTC())
		}
	}
	return e
}

// ErrNotHeld is the not_held error for key.
func ErrNotHeld(key string, sessionID string, token fencing.Token) error {
	e := problem.New(problem.NotHeld, "lock %s is not held by session %s with token %d", key, sessionID, token)
	e.Key = key
	return e
}

// ErrFree is the not_held error for revoking a free key.
func ErrFree(key string) error {
	e := problem.New(problem.NotHeld, "lock %s is not held by anyone", key)
	e.Key = key
	return e
}

// Unavailable wraps a store error as unavailable.
func Unavailable(what string, err error) error {
	return problem.Wrap(problem.Unavailable, err, "%s: the lock store is not reachable", what)
}

// SessionState computes the state shown to callers for a live session.
func SessionState(lastHeartbeat, now time.Time, ttl time.Duration) string {
	if now.Sub(lastHeartbeat) > ttl/2 {
		return StateSuspect
	}
	return StateActive
}

// Stringer helpers for logs.
func (g Grant) String() string { return fmt.Sprintf("%s@%d(%s)", g.Key, g.Token, g.SessionID) }
