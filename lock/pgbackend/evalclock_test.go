package pgbackend

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// Liveness is judged by the database's clock when the statement judges it,
// not when its transaction began (D-11, lockdb migration 00007). An acquire
// runs as one implicit transaction that waits for its keys' advisory locks
// before its statement decides, and a release can wait for its entry's row
// while another transaction changes it, then decide again on the changed
// row; with now(), the transaction's start, a session whose lease ended
// during that wait was judged live.

// lapseWhileWaiting makes session id's lease end while an acquire waits
// for its key's advisory lock: its expiry moves to 100 ms from now (as if
// its TTL ran out then; the acquire's transaction began earlier, and its
// statement, which takes its snapshot once the wait is over, has not begun),
// and lapseWhileWaiting returns once the database's clock is 500 ms past it.
func lapseWhileWaiting(t *testing.T, ctx context.Context, b *Backend, id string) time.Time {
	t.Helper()
	expires := expireIn(t, ctx, b, id, 100*time.Millisecond)
	waitClockPast(t, ctx, b, expires.Add(500*time.Millisecond))
	return expires
}

// expireIn moves session id's expiry to d from the database's clock.
func expireIn(t *testing.T, ctx context.Context, b *Backend, id string, d time.Duration) time.Time {
	t.Helper()
	var expires time.Time
	if err := b.pool.QueryRow(ctx, `UPDATE lock_session SET expires_at = clock_timestamp() + $2 * interval '1 millisecond'
		WHERE id = $1 AND state = 'ACTIVE' RETURNING expires_at`, id, d.Milliseconds()).Scan(&expires); err != nil {
		t.Fatalf("move the expiry of session %s: %v", id, err)
	}
	return expires
}

// waitClockPast waits until the database's clock is past at.
func waitClockPast(t *testing.T, ctx context.Context, b *Backend, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var past bool
		if err := b.pool.QueryRow(ctx, `SELECT clock_timestamp() > $1`, at).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the database's clock did not pass %s within a minute", at)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noGrantsTo fails the test for every grant made to session id (and every
// lock it holds), naming how long after the session's expiry a grant was
// logged.
func noGrantsTo(t *testing.T, ctx context.Context, b *Backend, id string) {
	t.Helper()
	rows, err := b.pool.Query(ctx, `SELECT g.token, g.granted_at, s.expires_at, g.granted_at - s.expires_at
		  FROM lock_grant g JOIN lock_session s ON s.id = g.session_id WHERE g.session_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			token            int64
			granted, expires time.Time
			after            time.Duration
		)
		if err := rows.Scan(&token, &granted, &expires, &after); err != nil {
			t.Fatal(err)
		}
		if !granted.Before(expires) {
			t.Errorf("granted token %d to a session that expired at %s; grant logged %s after expiry",
				token, expires.UTC().Format(time.RFC3339Nano), after)
		} else {
			t.Errorf("granted token %d to a session whose lease ended while the acquire waited (granted at %s, %s before its expiry at %s)",
				token, granted.UTC().Format(time.RFC3339Nano), -after, expires.UTC().Format(time.RFC3339Nano))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var entries int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_entry WHERE session_id = $1`, id).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if entries != 0 {
		t.Errorf("session %s holds %d locks after its lease ended", id, entries)
	}
}

// TestAcquireJudgesLivenessWhenItRuns: an acquire whose transaction began
// while its session was live, and that waited for its key's advisory lock
// (another acquire of the key) until the session's lease had ended, grants
// nothing and answers session_expired: by the free-key statement (Acquire
// of a free key) and by the full acquire statement. Before, both judged the
// session by now(), the transaction's start, and granted a fresh token to a
// session that had expired 500 ms earlier.
func TestAcquireJudgesLivenessWhenItRuns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		acquire func(ctx context.Context, b *Backend, key, session string) error
	}{
		{"free key, fast path", func(ctx context.Context, b *Backend, key, session string) error {
			_, err := b.Acquire(ctx, key, session)
			return err
		}},
		{"acquire statement", func(ctx context.Context, b *Backend, key, session string) error {
			_, _, err := b.acquireOnce(ctx, key, session)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, b := openFresh(t) // no reaper runs: only the acquire judges the session
			s, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			const key = "clock:acquire"
			// Another acquire of the key holds its advisory lock.
			blocker := holding(t, ctx, b, `SELECT pg_advisory_xact_lock(hashtextextended($1, 7101))`, key)
			done := make(chan error, 1)
			go func() { done <- c.acquire(ctx, b, key, s.ID) }()
			waitForLockWait(t, ctx, b) // the acquire's transaction has begun and waits
			lapseWhileWaiting(t, ctx, b, s.ID)
			if err := blocker.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			err = <-done
			noGrantsTo(t, ctx, b, s.ID)
			if !problem.Has(err, problem.SessionExpired) {
				t.Errorf("acquire by a session whose lease ended while the acquire waited: %v; want session_expired", err)
			}
		})
	}
}

// TestReleaseJudgesLivenessWhenItRuns: a release whose statement began
// while its session was live, and waited for its entry's row (a waiting
// acquire marking it contended) until the session's lease had ended,
// releases nothing (not_held) once the row is free, and the grant ends as
// expired, by the reaper. Before, the release judged the session again on
// the changed row by now(), its transaction's start, and logged the grant
// released.
func TestReleaseJudgesLivenessWhenItRuns(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t) // no reaper runs: the test reaps once the release has answered
	// The lease must end after the release's statement has begun (its
	// snapshot holds the session's expiry) and first judged the session:
	// on a slow machine the lease is made longer until it does.
	for lease := time.Second; !releaseAcrossExpiry(t, ctx, b, lease); lease *= 2 {
		if lease >= 32*time.Second {
			t.Fatalf("no release began before its session's lease (up to %s) ended", lease)
		}
	}
}

// releaseAcrossExpiry is one try of TestReleaseJudgesLivenessWhenItRuns
// with a session whose lease ends lease from now; false when the release
// answered before it waited (the lease ended first) and nothing was
// checked.
func releaseAcrossExpiry(t *testing.T, ctx context.Context, b *Backend, lease time.Duration) bool {
	t.Helper()
	s, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	key := "clock:release:" + lease.String()
	g, err := b.Acquire(ctx, key, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What markContended does, in a transaction the test commits once the
	// session's lease has ended.
	marker := holding(t, ctx, b, `UPDATE lock_entry SET contended = true WHERE key = $1`, key)
	expires := expireIn(t, ctx, b, s.ID, lease)
	done := make(chan error, 1)
	go func() {
		_, err := b.Release(ctx, key, s.ID, g.Token)
		done <- err
	}()
	// The release's statement waits for the entry's row.
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-done:
			if err := marker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("the release answered (%v) before it waited: the %s lease ended first; trying a longer one", err, lease)
			return false
		default:
		}
		var waiting int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the release neither waited for the entry's row nor answered within a minute")
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitClockPast(t, ctx, b, expires.Add(500*time.Millisecond))
	if err := marker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !problem.Has(err, problem.NotHeld) {
		t.Errorf("release by a session whose lease ended while the release waited: %v; want not_held", err)
	}
	if err := b.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		ended         bool
		reason, actor *string
	)
	if err := b.pool.QueryRow(ctx, `SELECT ended_at IS NOT NULL, end_reason, actor FROM lock_grant WHERE token = $1`, int64(g.Token)).Scan(&ended, &reason, &actor); err != nil {
		t.Fatal(err)
	}
	if !ended || deref(reason) != backend.EndExpired || deref(actor) != "lock-service" {
		t.Errorf("grant %d of a session that expired at %s: ended %v, reason %q, actor %q; want expired by the lock service",
			g.Token, expires.UTC().Format(time.RFC3339Nano), ended, deref(reason), deref(actor))
	}
	return true
}

// TestLivenessIsInlinedWithTheClock: every statement that asks whether a
// session is live has lock_session_live inlined (lockdb migration 00005),
// comparing the session's expiry with clock_timestamp() (00007), and looks
// the session up by its primary key. A STABLE lock_session_live whose body
// calls clock_timestamp() is not inlined: each call would run its body in
// the SQL function executor.
func TestLivenessIsInlinedWithTheClock(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s, err := b.CreateSession(ctx, "a", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err := b.Acquire(ctx, "inline:held", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		sql  string
		args []any
	}{
		{"acquire of free keys", freeAcquireSQL, []any{[]string{"inline:free"}, []string{s.ID}}},
		{"acquire", acquireSQL, []any{"inline:held", s.ID}},
		{"release", releaseSQL, []any{[]string{"inline:held"}, []string{s.ID}, []int64{int64(g.Token)}}},
		{"keepalive", keepAliveSQL, []any{s.ID}},
		{"close", closeSessionSQL, []any{s.ID}},
		{"session read", `SELECT ` + sessionCols + ` FROM lock_session WHERE id = $1`, []any{s.ID}},
		{"lock read", lockSelect + ` AND e.key = $1`, []any{"inline:held"}},
		{"reaper", reapSQL, nil},
	} {
		var lines []string
		rows, err := b.pool.Query(ctx, `EXPLAIN (VERBOSE, COSTS OFF) `+c.sql, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "lock_session_live(") {
			t.Errorf("%s: lock_session_live is called, not inlined:\n%s", c.name, plan)
		}
		if !strings.Contains(plan, "expires_at > clock_timestamp()") && !strings.Contains(plan, "expires_at <= clock_timestamp()") {
			t.Errorf("%s: no session's expiry compared with clock_timestamp():\n%s", c.name, plan)
		}
		if !strings.Contains(plan, "lock_session_pkey") && c.name != "reaper" {
			t.Errorf("%s: the session is not looked up by its primary key:\n%s", c.name, plan)
		}
	}
}
