package pgbackend

import (
	"testing"
	"time"

	"github.com/payouts/payouts/lock/backend"
)

// TestCloseFreesALockGrantedWhileItWaited: an acquire that has read its
// session FOR SHARE and inserted its entry, but not committed, when the
// session's close begins makes the close wait for the session's row. The
// acquire then commits; the close must free that lock too and end its
// grant as released by the session close. Before, the close was one
// statement whose snapshot predated the acquire's commit: it closed the
// session and left the entry, held by a CLOSED session until the reaper
// ended its grant as expired.
func TestCloseFreesALockGrantedWhileItWaited(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s, err := b.CreateSession(ctx, "closer", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The acquire, as the backend makes it, in a transaction the test
	// commits once the close waits for it.
	acq := holding(t, ctx, b, `SELECT 1`)
	var (
		key, owner, sid string
		token           int64
		expires         time.Time
	)
	if err := acq.QueryRow(ctx, freeAcquireSQL, []string{"close:raced"}, []string{s.ID}).Scan(&key, &owner, &sid, &token, &expires); err != nil {
		t.Fatalf("acquire in the open transaction: %v", err)
	}
	closed := make(chan error, 1)
	go func() {
		cs, err := b.CloseSession(ctx, s.ID)
		if err == nil && cs.State != backend.StateClosed {
			t.Errorf("close answered state %s; want CLOSED", cs.State)
		}
		closed <- err
	}()
	waitForLockWait(t, ctx, b) // the close waits for the session's row
	if err := acq.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	var left int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_entry WHERE session_id = $1`, s.ID).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d locks of the closed session remain; want none", left)
	}
	var (
		ended         bool
		reason, actor *string
	)
	if err := b.pool.QueryRow(ctx, `SELECT ended_at IS NOT NULL, end_reason, actor FROM lock_grant WHERE token = $1`, token).Scan(&ended, &reason, &actor); err != nil {
		t.Fatal(err)
	}
	if !ended || deref(reason) != backend.EndReleased || deref(actor) != "session closed" {
		t.Errorf("grant %d granted while the close waited: ended %v, reason %q, actor %q; want released by the session close",
			token, ended, deref(reason), deref(actor))
	}
}
