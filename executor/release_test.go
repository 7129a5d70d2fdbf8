package executor

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// flakyGrant's release fails with the queued errors, then succeeds.
type flakyGrant struct {
	key   string
	errs  []error
	calls *int
}

func (g *flakyGrant) Key() string            { return g.key }
func (g *flakyGrant) Token() fencing.Token   { return 7 }
func (g *flakyGrant) Holder() fencing.Holder { return "s-1" }
func (g *flakyGrant) Valid() bool            { return true }
func (g *flakyGrant) Done() <-chan struct{}  { return nil }
func (g *flakyGrant) Release(context.Context) error {
	*g.calls++
	if len(g.errs) == 0 {
		return nil
	}
	err := g.errs[0]
	g.errs = g.errs[1:]
	return err
}

func TestReleaseRetryable(t *testing.T) {
	noAnswer := fmt.Errorf("POST /v1/locks/payout:a/release: %w: connection refused", httpx.ErrTransport)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{noAnswer, true},
		{problem.New(problem.Unavailable, "etcd has no leader"), true},
		{problem.New(problem.NotHeld, "not held"), false},
		{problem.New(problem.SessionExpired, "gone"), false},
		{fmt.Errorf("release: %w", lockclient.ErrSessionLost), false},
	} {
		if got := releaseRetryable(tc.err); got != tc.want {
			t.Errorf("releaseRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestFailedReleaseIsRetriedUntilItLands: a release the lock service never
// answered is retried on later polls, so a live session does not keep the
// key (and block every other holder) for the rest of the process's life.
func TestFailedReleaseIsRetriedUntilItLands(t *testing.T) {
	e := &Executor{base: context.Background(), cfg: Config{CallTimeout: DefaultCallTimeout}, unreleased: map[string]grant{}}
	log := slog.New(slog.DiscardHandler)
	calls := 0
	noAnswer := fmt.Errorf("%w: connection refused", httpx.ErrTransport)
	g := &flakyGrant{key: "payout:a", errs: []error{noAnswer, problem.New(problem.Unavailable, "restarting")}, calls: &calls}
	e.releaseLater(g)
	e.retryReleases(log) // fails again: kept
	if _, ok := e.unreleased["payout:a"]; !ok || calls != 1 {
		t.Fatalf("after a second failure: kept=%v calls=%d; want kept, 1 call", ok, calls)
	}
	e.retryReleases(log) // fails again: kept
	e.retryReleases(log) // lands
	if _, ok := e.unreleased["payout:a"]; ok || calls != 3 {
		t.Fatalf("after the release landed: kept=%v calls=%d; want dropped after 3 calls", ok, calls)
	}
	// A verdict (the key moved on) also ends the retries.
	g2 := &flakyGrant{key: "payout:b", errs: []error{problem.New(problem.NotHeld, "not held")}, calls: &calls}
	e.releaseLater(g2)
	e.retryReleases(log)
	if _, ok := e.unreleased["payout:b"]; ok {
		t.Fatal("a release refused as not_held is retried forever")
	}
}
