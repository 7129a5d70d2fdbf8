package reconcile

import (
	"context"
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// GrantRecord is one entry of the lock service's grant log (DESIGN D-9).
type GrantRecord struct {
	Token fencing.Token
	Key   string
	// SessionID is the session the token was granted to: the holder every
	// write under this token must name.
	SessionID string
}

// Lease is a grant the reconciler holds while it resolves one payout.
type Lease struct {
	Token  fencing.Token
	Holder fencing.Holder
	// Ctx, when set, ends once the grant can no longer be relied on
	// (released, or its session lost): a write under it is abandoned.
	Ctx context.Context
	// Healthy, when set, reports whether a new step may start under the
	// grant: not when a keepalive of its session has failed (JEOPARDY,
	// D-11), since its session may expire before the write lands.
	Healthy func() bool
}

// usable reports whether a new step may start under the lease.
func (l Lease) usable() bool {
	if l.Ctx != nil && l.Ctx.Err() != nil {
		return false
	}
	return l.Healthy == nil || l.Healthy()
}

// LockService is what the reconciler needs from the lock service: the
// grant log and the highest issued token (read), and grants to act under
// (ambiguity resolution, D-8). NewLockService implements it over
// lockclient.
type LockService interface {
	// Grants returns the grant log in token order after the given token
	// (0: from the start), and the cursor of the next page (0 at the end).
	Grants(ctx context.Context, after fencing.Token, limit int) ([]GrantRecord, fencing.Token, error)
	// HighToken is the highest token the service has issued.
	HighToken(ctx context.Context) (fencing.Token, error)
	// Acquire takes key, waiting up to wait for it to be free (0: at
	// once); held is true (and err nil) when another session still holds
	// it.
	Acquire(ctx context.Context, key string, wait time.Duration) (lease Lease, held bool, err error)
	// Release gives back a lease taken with Acquire. A release that got
	// no verdict is kept and retried by RetryReleases: the lease is
	// forgotten only once the lock service acknowledges it.
	Release(ctx context.Context, key string, lease Lease) error
	// RetryReleases retries the releases that got no verdict and reports
	// how many are still pending (with the last error).
	RetryReleases(ctx context.Context) (pending int, err error)
	// Close ends the reconciler's lock session, if one was opened.
	Close(ctx context.Context) error
}
