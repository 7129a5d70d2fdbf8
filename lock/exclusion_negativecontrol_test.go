package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/payouts/payouts/dev/lockhistory"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestExclusionNegativeControl is INV-06's negative control on the
// PostgreSQL backend. A holds the key; B, with a live session of its own,
// asks for it; A then releases. Built with the negativecontrol tag the
// acquire's mutual-exclusion condition is gone (lock/pgbackend
// exclusion_negativecontrol.go): B is granted while A still holds, A's
// release finds the key gone, and the detective — the linearizability check
// of the recorded history against the fenced-mutex model — reports the
// history illegal. In a release build B is told lock_held, A's release
// succeeds, and the same check passes.
func TestExclusionNegativeControl(t *testing.T) {
	svc := setup(t, "postgres").svc
	ctx := testCtx(t)
	cl, err := lockclient.New(svc.URL, lockclient.WithToken(executorToken))
	if err != nil {
		t.Fatal(err)
	}
	open := func(owner string) *lockclient.Session {
		s, err := lockclient.Open(ctx, svc.URL, owner, lockclient.WithToken(executorToken), lockclient.WithTTL(60*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(testCtx(t)) })
		return s
	}
	a, b := open("holder-a"), open("holder-b")
	const key = "payout:nc-exclusion"
	rec := &recorder{start: time.Now()}

	call := rec.now()
	ga, err := acquireVia(ctx, cl, a.ID(), key, 0)
	if err != nil {
		t.Fatalf("A acquires: %v", err)
	}
	rec.add(0, lockhistory.Input{Op: lockhistory.OpAcquire, Key: key, Session: a.ID()}, lockhistory.Output{OK: true, Token: ga.Token}, call, rec.now())

	call = rec.now()
	gb, errB := acquireVia(ctx, cl, b.ID(), key, 0)
	switch {
	case errB == nil:
		rec.add(1, lockhistory.Input{Op: lockhistory.OpAcquire, Key: key, Session: b.ID()}, lockhistory.Output{OK: true, Token: gb.Token}, call, rec.now())
	case errors.Is(errB, lockclient.ErrLockHeld):
		rec.add(1, lockhistory.Input{Op: lockhistory.OpAcquire, Key: key, Session: b.ID()}, lockhistory.Output{}, call, rec.now())
	default:
		t.Fatalf("B acquires: %v", errB)
	}

	call = rec.now()
	errRel := releaseVia(ctx, cl, a.ID(), key, ga.Token)
	if errRel != nil && !errors.Is(errRel, lockclient.ErrNotHeld) {
		t.Fatalf("A releases: %v", errRel)
	}
	rec.add(0, lockhistory.Input{Op: lockhistory.OpRelease, Key: key, Session: a.ID(), Token: ga.Token}, lockhistory.Output{OK: errRel == nil}, call, rec.now())

	res := porcupine.CheckOperations(lockhistory.Model, rec.ops)
	if primariesRemoved {
		if errB != nil || !errors.Is(errRel, lockclient.ErrNotHeld) {
			t.Fatalf("exclusion removed: B should be granted while A holds (B: %v) and A's release find the key gone (%v)", errB, errRel)
		}
		if res {
			t.Fatal("exclusion removed: the linearizability check passed a history with two live holders")
		}
		return
	}
	if !errors.Is(errB, lockclient.ErrLockHeld) || errRel != nil {
		t.Fatalf("exclusion in place: want B lock_held (%v) and A's release to succeed (%v)", errB, errRel)
	}
	if !res {
		t.Fatal("exclusion in place: the linearizability check rejected a legal history")
	}
}
