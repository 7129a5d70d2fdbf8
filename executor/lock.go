package executor

import (
	"context"
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// The executor sees the lock service through these two interfaces, which
// lockclient's Session and Grant satisfy through a thin adapter
// (lockadapter.go). They carry nothing but what the worker needs, so the
// token stays an explicit value the worker passes to every guard.

// session is one lock session: every grant of this executor hangs off it,
// and closing it releases them all.
type session interface {
	// TryAcquire takes key without waiting. A lock_held problem means
	// another session holds it, which is normal.
	TryAcquire(ctx context.Context, key string) (grant, error)
	// Acquire waits up to wait for key (operator commands).
	Acquire(ctx context.Context, key string, wait time.Duration) (grant, error)
	// Healthy is false once a keepalive has failed (JEOPARDY) or the
	// session is lost: nothing new may start.
	Healthy() bool
	// Lost reports the session's client deadline has passed (terminal).
	Lost() bool
	// ID is the session id: the holder every guard records.
	ID() string
	// Close releases every lock of the session and ends it.
	Close(ctx context.Context) error
}

// grant is one held lock.
type grant interface {
	Key() string
	Token() fencing.Token
	Holder() fencing.Holder
	// Valid is the client-side check before each step: the conservative
	// deadline has not passed and the session is not in jeopardy. It is
	// liveness only; the guards provide safety.
	Valid() bool
	// Done is closed when the grant is lost (its deadline passed).
	Done() <-chan struct{}
	// Release gives the lock back (compare-and-delete on the token).
	Release(ctx context.Context) error
}

// locker opens sessions.
type locker interface {
	Open(ctx context.Context, owner string) (session, error)
}
