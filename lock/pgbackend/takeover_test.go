package pgbackend

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/migrations"
)

// takeoverRig is one backend (its background loop not running, so nothing
// but the test ends a session) on a fresh lockdb, with session A (TTL one
// minute) holding key.
type takeoverRig struct {
	b    *Backend
	ctx  context.Context
	key  string
	a    backend.Session
	held backend.Grant
}

func setupTakeover(t *testing.T) *takeoverRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b, err := Open(ctx, Config{DatabaseURL: pgtest.NewDB(t, migrations.LockDB), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	r := &takeoverRig{b: b, ctx: ctx, key: "payout:race"}
	if r.a, err = b.CreateSession(ctx, "a", "p", time.Minute); err != nil {
		t.Fatal(err)
	}
	if r.held, err = b.Acquire(ctx, r.key, r.a.ID); err != nil {
		t.Fatal(err)
	}
	return r
}

// lapseIn moves A's expiry to d from the database's now, as if its last
// heartbeat had been a TTL minus d ago.
func (r *takeoverRig) lapseIn(t *testing.T, d time.Duration) {
	t.Helper()
	if _, err := r.b.pool.Exec(r.ctx, `UPDATE lock_session SET expires_at = now() + $2 * interval '1 millisecond' WHERE id = $1`,
		r.a.ID, d.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

// waitLapsed waits until A's expiry has passed by the database's clock.
func (r *takeoverRig) waitLapsed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var lapsed bool
		if err := r.b.pool.QueryRow(r.ctx, `SELECT expires_at < now() FROM lock_session WHERE id = $1`, r.a.ID).Scan(&lapsed); err != nil {
			t.Fatal(err)
		}
		if lapsed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("session A never lapsed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// blockedOrDone waits until done is closed or some statement waits for a
// row lock held by the test's open transaction. pg_locks spans the whole
// shared cluster, so the tests using it do not run in parallel with others.
func (r *takeoverRig) blockedOrDone(t *testing.T, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-done:
			return
		default:
		}
		var waiting bool
		if err := r.b.pool.QueryRow(r.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the concurrent statement neither finished nor waited")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKeepAliveInFlightAcrossTakeover: A's keepalive starts while A is
// live and its transaction is still open when A has lapsed and B acquires
// A's key. Exactly one may win: either the keepalive (B is refused) or the
// takeover (the keepalive fails). Before the takeover locked A's row, both
// succeeded: A was told it was live with token 1 while B held token 2.
func TestKeepAliveInFlightAcrossTakeover(t *testing.T) {
	r := setupTakeover(t)
	r.lapseIn(t, 5*time.Second)
	tx, err := r.b.pool.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	renewed, err := scanSession(tx.QueryRow(r.ctx, keepAliveSQL, r.a.ID))
	if err != nil {
		t.Fatalf("keepalive of a live session: %v", err)
	}
	r.waitLapsed(t)

	sb, err := r.b.CreateSession(r.ctx, "b", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var (
		g    backend.Grant
		gErr error
	)
	go func() { defer close(done); g, gErr = r.b.Acquire(r.ctx, r.key, sb.ID) }()
	r.blockedOrDone(t, done)
	if err := tx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if gErr == nil {
		t.Fatalf("INV-06: B was granted %s with token %d while A's keepalive committed (A live until %s, holding token %d)",
			r.key, g.Token, renewed.ExpiresAt, r.held.Token)
	}
	if !problem.Has(gErr, problem.LockHeld) {
		t.Fatalf("B's acquire: %v; want lock_held", gErr)
	}
	s, err := r.b.Session(r.ctx, r.a.ID)
	if err != nil || s.State == backend.StateExpired || s.State == backend.StateClosed {
		t.Fatalf("A after its keepalive won: %+v, %v", s, err)
	}
}

// TestTakeoverInFlightAcrossKeepAlive: A's keepalive transaction starts
// while A is live (its now() is before A's expiry) and its statement runs
// only while B's acquire, which took A's lapsed key over, is still open.
// Once the takeover commits the keepalive must have failed; before the
// takeover ended A's session on its row, the keepalive answered that A was
// live. Since liveness is judged by the clock when the statement runs
// (00007) the keepalive fails on its own check at once, or, in the instant
// between that check and its row lock, waits for the takeover and fails on
// the row's newest version; either way the takeover must have ended A on
// its row (EXPIRED in lock_session itself, not only past its expiry).
func TestTakeoverInFlightAcrossKeepAlive(t *testing.T) {
	r := setupTakeover(t)
	sb, err := r.b.CreateSession(r.ctx, "b", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	r.lapseIn(t, 5*time.Second)
	ktx, err := r.b.pool.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ktx.Rollback(context.Background())
	var live bool // the keepalive's transaction starts here, before A's expiry
	if err := ktx.QueryRow(r.ctx, `SELECT expires_at > now() FROM lock_session WHERE id = $1`, r.a.ID).Scan(&live); err != nil || !live {
		t.Fatalf("A should still be live when its keepalive starts: %v %v", live, err)
	}
	r.waitLapsed(t)

	tx, err := r.b.pool.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(r.ctx, acquireSQL, r.key, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var (
		outcome string
		token   int64
	)
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		outcome, token = v[0].(string), v[4].(int64)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if outcome != "granted" || token <= int64(r.held.Token) {
		t.Fatalf("B's takeover: %s with token %d; want granted above %d", outcome, token, r.held.Token)
	}
	done := make(chan struct{})
	var (
		s    backend.Session
		kErr error
	)
	go func() {
		defer close(done)
		if s, kErr = scanSession(ktx.QueryRow(r.ctx, keepAliveSQL, r.a.ID)); kErr == nil {
			kErr = ktx.Commit(r.ctx)
		}
	}()
	r.blockedOrDone(t, done)
	if err := tx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if kErr == nil {
		t.Fatalf("INV-06: A's keepalive succeeded (live until %s, believing it holds token %d) after B took %s over with token %d",
			s.ExpiresAt, r.held.Token, r.key, token)
	}
	if !errors.Is(kErr, pgx.ErrNoRows) {
		t.Fatalf("A's keepalive: %v; want no row (session_expired)", kErr)
	}
	var state string
	if err := r.b.pool.QueryRow(r.ctx, `SELECT state FROM lock_session WHERE id = $1`, r.a.ID).Scan(&state); err != nil || state != "EXPIRED" {
		t.Fatalf("A's row after the takeover: state %q, %v; want EXPIRED, written by the takeover (a later grace period must not revive it)", state, err)
	}
}

// TestRevokeAcrossTakeover: an operator's revoke of a key starts while an
// acquire that takes the key over from a lapsed holder (A) is committing
// for B. The revoke ends B's grant, as revoked, and leaves no grant open
// without its entry. Before the revoke took the key's advisory lock, its
// DELETE followed the entry to B's new row and freed the key, while its
// UPDATE, on a snapshot older than B's grant, ended nothing: "not held"
// was answered, B's grant stayed open for good, and C was then granted the
// key beside it.
func TestRevokeAcrossTakeover(t *testing.T) {
	r := setupTakeover(t)
	sb, err := r.b.CreateSession(r.ctx, "b", "p", backend.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	r.lapseIn(t, 200*time.Millisecond)
	r.waitLapsed(t)
	tx, err := r.b.pool.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	// B's acquire, as sendAcquire runs it: the key's lock, then the statement.
	if _, err := tx.Exec(r.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 7101))`, r.key); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(r.ctx, acquireSQL, r.key, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var outcome string
	var token int64
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		outcome, token = v[0].(string), v[4].(int64)
	}
	if rows.Close(); rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if outcome != "granted" || token <= int64(r.held.Token) {
		t.Fatalf("takeover: %s, token %d (A held %d)", outcome, token, r.held.Token)
	}
	done := make(chan struct{})
	var rec backend.GrantRecord
	var rerr error
	go func() { defer close(done); rec, rerr = r.b.Revoke(r.ctx, r.key, "op", "wedged") }()
	r.blockedOrDone(t, done)
	if err := tx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if rerr != nil || int64(rec.Token) != token || rec.EndReason != "revoked" {
		t.Fatalf("revoke: %+v, %v; want B's grant %d ended as revoked", rec, rerr, token)
	}
	var entries, open int
	if err := r.b.pool.QueryRow(r.ctx, `SELECT (SELECT count(*) FROM lock_entry WHERE key = $1),
		(SELECT count(*) FROM lock_grant WHERE key = $1 AND ended_at IS NULL)`, r.key).Scan(&entries, &open); err != nil {
		t.Fatal(err)
	}
	if entries != 0 || open != 0 {
		t.Fatalf("after the revoke: %d entries of %s, %d grants of it open; want none", entries, r.key, open)
	}
}

// TestRevokeOfALapsedHolderIsNotHeld: a holder whose session has lapsed,
// not yet reaped, holds nothing (Lock shows the key free): a revoke of its
// key answers not_held and records no revocation; the reaper ends that
// grant as expired.
func TestRevokeOfALapsedHolderIsNotHeld(t *testing.T) {
	r := setupTakeover(t)
	r.lapseIn(t, 100*time.Millisecond)
	r.waitLapsed(t)
	if _, err := r.b.Revoke(r.ctx, r.key, "op", "wedged"); !problem.Has(err, problem.NotHeld) {
		t.Fatalf("revoke of a lapsed holder's key: %v, want not_held", err)
	}
	var reason *string
	if err := r.b.pool.QueryRow(r.ctx, `SELECT end_reason FROM lock_grant WHERE token = $1`, int64(r.held.Token)).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if reason != nil {
		t.Fatalf("A's grant ended as %q by the revoke; want it left for the reaper", *reason)
	}
}
