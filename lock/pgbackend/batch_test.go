package pgbackend

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/backend/backendtest"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
)

// TestOneStatementSettlesEachKeyOfItsBatch: one free-acquire statement
// grants each free key to its live session, with its own token and grant
// record, and leaves a held key, a closed session's key and the second
// request for a key to the full acquire; one release statement ends each
// grant it names rightly and refuses the one named with a wrong token, and
// a second release of one grant.
func TestOneStatementSettlesEachKeyOfItsBatch(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s := make([]backend.Session, 3)
	for i := range s {
		var err error
		if s[i], err = b.CreateSession(ctx, fmt.Sprintf("owner-%d", i), "p", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	held, err := b.Acquire(ctx, "batch:held", s[2].ID)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := b.CreateSession(ctx, "closed", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CloseSession(ctx, closed.ID); err != nil {
		t.Fatal(err)
	}
	res, err := b.acquireFreeBatch(ctx, []acquireReq{
		{"batch:a", s[0].ID}, {"batch:held", s[1].ID}, {"batch:b", s[1].ID}, {"batch:closed", closed.ID}, {"batch:c", s[0].ID},
		{"batch:a", s[2].ID},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantGranted := []bool{true, false, true, false, true, false}
	tokens := map[fencing.Token]bool{held.Token: true}
	for i, r := range res {
		if r.granted != wantGranted[i] {
			t.Fatalf("request %d: granted %v, want %v", i, r.granted, wantGranted[i])
		}
		if !r.granted {
			continue
		}
		if tokens[r.grant.Token] || r.grant.Token <= held.Token {
			t.Errorf("request %d: token %d repeats or is not above the earlier grant's %d", i, r.grant.Token, held.Token)
		}
		tokens[r.grant.Token] = true
	}
	if g := res[2].grant; g.Key != "batch:b" || g.SessionID != s[1].ID || g.Owner != "owner-1" || g.ServerExpiry.IsZero() {
		t.Errorf("grant of batch:b: %+v", g)
	}
	var open int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_grant WHERE ended_at IS NULL AND token = ANY ($1)`,
		[]int64{int64(res[0].grant.Token), int64(res[2].grant.Token), int64(res[4].grant.Token)}).Scan(&open); err != nil || open != 3 {
		t.Errorf("%d open grant records for the batch's grants (err %v), want 3", open, err)
	}
	if _, err := b.Acquire(ctx, "batch:held", s[1].ID); !problem.Has(err, problem.LockHeld) {
		t.Errorf("the held key after the batch: %v, want lock_held", err)
	}

	rel, err := b.releaseBatch(ctx, []releaseReq{
		{"batch:a", s[0].ID, res[0].grant.Token},
		{"batch:b", s[1].ID, res[2].grant.Token + 1000},
		{"batch:c", s[0].ID, res[4].grant.Token},
		{"batch:a", s[0].ID, res[0].grant.Token},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, true, false} {
		if rel[i].released != want {
			t.Errorf("release %d: released %v, want %v", i, rel[i].released, want)
		}
	}
	if r := rel[2].rec; r.Key != "batch:c" || r.Token != res[4].grant.Token || r.EndReason != backend.EndReleased || r.EndedAt == nil {
		t.Errorf("record of batch:c's release: %+v", r)
	}
	for key, want := range map[string]bool{"batch:a": false, "batch:b": true, "batch:c": false} {
		if l, err := b.Lock(ctx, key); err != nil || l.Held != want {
			t.Errorf("%s after the release: held %v (err %v), want %v", key, l.Held, err, want)
		}
	}
}

// TestConcurrentAcquiresAndReleasesShareStatements: acquires (and
// releases) that arrive while one of their kind is in flight go to
// PostgreSQL together, as one statement, and each caller gets its own
// grant (and record); each statement's size reaches the observer
// (payouts_lock_store_batch_calls).
func TestConcurrentAcquiresAndReleasesShareStatements(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	sizes := &backendtest.BatchRecorder{}
	b.SetObserver(sizes)
	const n = 6
	sessions := make([]backend.Session, n)
	for i := range sessions {
		var err error
		if sessions[i], err = b.CreateSession(ctx, fmt.Sprintf("c%d", i), "p", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	var acquires *statementGate
	b.freeAcquires, acquires = gated(t, b.acquireFreeBatch, b.batchOptions("acquire"))
	grants := make([]backend.Grant, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			var err error
			grants[i], err = b.Acquire(ctx, fmt.Sprintf("share:%d", i), sessions[i].ID)
			errs <- err
		}()
		if i == 0 {
			<-acquires.started
		} else {
			waitBatched(t, b.freeAcquires.Waiting, i)
		}
	}
	acquires.open()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := acquires.sizes(); fmt.Sprint(got) != fmt.Sprint([]int{1, n - 1}) {
		t.Errorf("acquire statements of sizes %v, want [1 %d]", got, n-1)
	}
	seen := map[fencing.Token]bool{}
	for i, g := range grants {
		if g.SessionID != sessions[i].ID || seen[g.Token] {
			t.Errorf("grant %d: %+v (token repeated: %v)", i, g, seen[g.Token])
		}
		seen[g.Token] = true
	}

	var releases *statementGate
	b.releases, releases = gated(t, b.releaseBatch, b.batchOptions("release"))
	for i := range n {
		go func() {
			_, err := b.Release(ctx, grants[i].Key, grants[i].SessionID, grants[i].Token)
			errs <- err
		}()
		if i == 0 {
			<-releases.started
		} else {
			waitBatched(t, b.releases.Waiting, i)
		}
	}
	releases.open()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := releases.sizes(); fmt.Sprint(got) != fmt.Sprint([]int{1, n - 1}) {
		t.Errorf("release statements of sizes %v, want [1 %d]", got, n-1)
	}
	var open int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_grant WHERE ended_at IS NULL`).Scan(&open); err != nil || open != 0 {
		t.Errorf("%d grants still open (err %v), want 0", open, err)
	}
	b.freeAcquires.Wait()
	b.releases.Wait()
	if got, want := sizes.String(), fmt.Sprintf("acquire:1 acquire:%d release:1 release:%d", n-1, n-1); got != want {
		t.Errorf("statement sizes observed: %s, want %s", got, want)
	}
}

// TestCallsTheirCallersGaveUpOnAreNotMade: an acquire or a release whose
// caller's context ends while it waits for a statement gets its context's
// error and is not made: the key stays free (or held), as its caller was
// told.
func TestCallsTheirCallersGaveUpOnAreNotMade(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s, err := b.CreateSession(ctx, "owner", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(ctx, "gone:held", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var acquires, releases *statementGate
	b.freeAcquires, acquires = gated(t, b.acquireFreeBatch, b.batchOptions("acquire"))
	b.releases, releases = gated(t, b.releaseBatch, b.batchOptions("release"))
	first := make(chan error, 2)
	go func() { _, err := b.Acquire(ctx, "gone:first", s.ID); first <- err }()
	<-acquires.started
	go func() { _, err := b.Release(ctx, "gone:first-held", s.ID, 1); first <- err }()
	<-releases.started

	gctx, giveUp := context.WithCancel(ctx)
	gone := make(chan error, 2)
	go func() { _, err := b.Acquire(gctx, "gone:free", s.ID); gone <- err }()
	go func() { _, err := b.Release(gctx, held.Key, s.ID, held.Token); gone <- err }()
	waitBatched(t, b.freeAcquires.Waiting, 1)
	waitBatched(t, b.releases.Waiting, 1)
	giveUp()
	for range 2 {
		if err := <-gone; err == nil {
			t.Fatal("a call whose caller gave up answered success")
		}
	}
	acquires.open()
	releases.open()
	for range 2 {
		<-first
	}
	b.freeAcquires.Wait()
	b.releases.Wait()
	if l, err := b.Lock(ctx, "gone:free"); err != nil || l.Held {
		t.Errorf("gone:free after its caller gave up on the acquire: %+v, %v; want free", l, err)
	}
	if l, err := b.Lock(ctx, held.Key); err != nil || !l.Held || l.Token != held.Token {
		t.Errorf("%s after its caller gave up on the release: %+v, %v; want still held", held.Key, l, err)
	}
	if got := fmt.Sprint(acquires.sizes(), releases.sizes()); got != "[1] [1]" {
		t.Errorf("statements of sizes %s, want [1] [1]: the calls given up on made none", got)
	}
}

// statementGate wraps a batch function: it records each batch's size and
// holds the first until the gate opens (at the latest when the test ends,
// before the backend's Close waits for the batch).
type statementGate struct {
	started, gate chan struct{}
	batches       chan int
	first, opened sync.Once
}

func gated[Req, Res any](t *testing.T, write batcher.Func[Req, Res], opts batcher.Options) (*batcher.Batcher[Req, Res], *statementGate) {
	g := &statementGate{started: make(chan struct{}), gate: make(chan struct{}), batches: make(chan int, 100)}
	t.Cleanup(g.open)
	return batcher.New(func(ctx context.Context, reqs []Req) ([]Res, error) {
		g.batches <- len(reqs)
		g.first.Do(func() {
			close(g.started)
			<-g.gate
		})
		return write(ctx, reqs)
	}, opts), g
}

// open lets the held batch go on.
func (g *statementGate) open() { g.opened.Do(func() { close(g.gate) }) }

func (g *statementGate) sizes() []int {
	var out []int
	for {
		select {
		case n := <-g.batches:
			out = append(out, n)
		default:
			return out
		}
	}
}

// waitBatched waits until n calls wait for a batch.
func waitBatched(t *testing.T, waiting func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for waiting() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait, want %d", waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitForLockWait waits until a statement in this test's database waits
// for a lock.
func waitForLockWait(t *testing.T, ctx context.Context, b *Backend) {
	t.Helper()
	waitForLockWaits(t, ctx, b, 1)
}

// waitForLockWaits waits until n statements in this test's database wait
// for a lock.
func waitForLockWaits(t *testing.T, ctx context.Context, b *Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d statements wait for a lock, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestABatchThatDeadlocksIsSettledAgain: a free-acquire statement for two
// keys that PostgreSQL aborts as a deadlock grants nothing and has each
// acquire settled again; a release statement aborted as a deadlock runs
// again and releases.
func TestABatchThatDeadlocksIsSettledAgain(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s1, s2 := twoSessions(t, ctx, b)
	// The cycle: the statement holds k1's advisory lock and waits for s2's
	// row, which tx holds and then asks for k1's advisory lock.
	before := countDeadlocks(t, ctx, b)
	tx := holding(t, ctx, b, `SELECT 1 FROM lock_session WHERE id = $1 FOR UPDATE`, s2.ID)
	type outcome struct {
		res []acquireRes
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := b.acquireFreeBatch(ctx, []acquireReq{{"dl:k1", s1.ID}, {"dl:k2", s2.ID}})
		done <- outcome{res, err}
	}()
	waitForLockWait(t, ctx, b)
	txDone := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('dl:k1', 7101))`)
		txDone <- err
	}()
	out := <-done
	if out.err != nil {
		t.Fatalf("deadlocked statement: %v, want no error (each acquire settled again)", out.err)
	}
	for i, r := range out.res {
		if r.granted {
			t.Errorf("deadlocked statement granted request %d", i)
		}
	}
	if err := <-txDone; err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	g1, err := b.Acquire(ctx, "dl:k1", s1.ID)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := b.Acquire(ctx, "dl:k2", s2.ID)
	if err != nil {
		t.Fatal(err)
	}

	// Releases: the statement deletes k1's entry and waits for k2's, which
	// tx2 holds and then asks for k1's.
	tx2 := holding(t, ctx, b, `SELECT 1 FROM lock_entry WHERE key = 'dl:k2' FOR UPDATE`)
	relDone := make(chan error, 1)
	var rel []releaseRes
	go func() {
		var err error
		rel, err = b.releaseBatch(ctx, []releaseReq{{"dl:k1", s1.ID, g1.Token}, {"dl:k2", s2.ID, g2.Token}})
		relDone <- err
	}()
	waitForLockWait(t, ctx, b)
	tx2Done := make(chan error, 1)
	go func() {
		_, err := tx2.Exec(ctx, `SELECT 1 FROM lock_entry WHERE key = 'dl:k1' FOR UPDATE`)
		tx2Done <- err
	}()
	if err := <-tx2Done; err != nil {
		t.Fatal(err)
	}
	if err := tx2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-relDone; err != nil {
		t.Fatalf("release statement after a deadlock: %v", err)
	}
	for i, r := range rel {
		if !r.released {
			t.Errorf("release %d not done after the deadlock", i)
		}
	}
	waitDeadlocks(t, ctx, b, before, 2)
}

// TestAnErrorOfALaterStatementLeavesTheEarlierAnswers: a batch with a key
// asked twice runs as two statements; when the second fails, the caller
// whose grant the first committed still gets it, and only the second
// statement's caller gets the error.
func TestAnErrorOfALaterStatementLeavesTheEarlierAnswers(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s1, s2 := twoSessions(t, ctx, b)
	// The second statement waits for s2's row, and its context then ends.
	holding(t, ctx, b, `SELECT 1 FROM lock_session WHERE id = $1 FOR UPDATE`, s2.ID)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan []acquireRes, 1)
	go func() {
		res, err := b.acquireFreeBatch(bctx, []acquireReq{{"round:a", s1.ID}, {"round:a", s2.ID}})
		if err != nil {
			t.Errorf("batch: %v, want each request's own answer", err)
		}
		done <- res
	}()
	waitForLockWait(t, ctx, b)
	cancel()
	res := <-done
	if len(res) != 2 {
		t.Fatalf("answers %+v", res)
	}
	if !res[0].granted || res[0].err != nil || res[0].grant.SessionID != s1.ID {
		t.Errorf("first statement's request: %+v, want its grant", res[0])
	}
	if res[1].granted || res[1].err == nil {
		t.Errorf("second statement's request: %+v, want its statement's error", res[1])
	}
	if l, err := b.Lock(ctx, "round:a"); err != nil || !l.Held || l.Token != res[0].grant.Token {
		t.Errorf("round:a: %+v (err %v), want held with the first request's token", l, err)
	}
}

// TestCloseSessionRunsAgainAfterADeadlockWithAReleaseBatch: a release
// statement for two keys of a session and the close of that session
// delete its entries in opposite orders; when PostgreSQL picks the close
// as the deadlock's victim, the close runs again and succeeds.
func TestCloseSessionRunsAgainAfterADeadlockWithAReleaseBatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url := pgtest.NewDB(t, migrations.LockDB)
	// The closer's connections look for deadlocks first (the release's only
	// after a minute), so the close is the victim.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	b, err := Open(ctx, Config{DatabaseURL: url + sep + "deadlock_timeout=1min", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	closer, err := Open(ctx, Config{DatabaseURL: url + sep + "deadlock_timeout=50ms", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	s, err := b.CreateSession(ctx, "s", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ga, err := b.Acquire(ctx, "close:a", s.ID) // the close meets it first
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.Acquire(ctx, "close:b", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	// Hold close:a so that the close waits on it, then let the release
	// delete close:b and wait on close:a behind the close.
	tx := holding(t, ctx, b, `SELECT 1 FROM lock_entry WHERE key = 'close:a' FOR UPDATE`)
	deadlocksBefore := countDeadlocks(t, ctx, b)
	closed := make(chan error, 1)
	go func() { _, err := closer.CloseSession(ctx, s.ID); closed <- err }()
	waitForLockWaits(t, ctx, b, 1)
	released := make(chan []releaseRes, 1)
	go func() {
		rel, err := b.releaseBatch(ctx, []releaseReq{{"close:b", s.ID, gb.Token}, {"close:a", s.ID, ga.Token}})
		if err != nil {
			t.Errorf("release batch: %v", err)
		}
		released <- rel
	}()
	waitForLockWaits(t, ctx, b, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Errorf("close after a deadlock: %v, want it run again and done", err)
	}
	rel := <-released
	for key, g := range map[string]backend.Grant{"close:a": ga, "close:b": gb} {
		if l, err := b.Lock(ctx, key); err != nil || l.Held {
			t.Errorf("%s after the close and the releases: held %v (err %v)", key, l.Held, err)
		}
		var reason string
		if err := b.pool.QueryRow(ctx, `SELECT end_reason FROM lock_grant WHERE token = $1`, int64(g.Token)).Scan(&reason); err != nil || reason != backend.EndReleased {
			t.Errorf("%s's grant ended as %q (err %v), want released", key, reason, err)
		}
	}
	for i, r := range rel {
		if r.err != nil {
			t.Errorf("release %d: %v", i, r.err)
		}
	}
	waitDeadlocks(t, ctx, b, deadlocksBefore, 1)
}

// holding begins a transaction that takes a row lock the test holds
// (lockSQL) until it rolls the transaction back, or the test ends. It looks
// for deadlocks only after a minute, so that in a deadlock with a statement
// under test PostgreSQL aborts that statement, however late a loaded
// machine runs the statement's own check.
func holding(t *testing.T, ctx context.Context, b *Backend, lockSQL string, args ...any) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '1min'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, lockSQL, args...); err != nil {
		t.Fatal(err)
	}
	return tx
}

// twoSessions opens two sessions, s1 and s2.
func twoSessions(t *testing.T, ctx context.Context, b *Backend) (backend.Session, backend.Session) {
	t.Helper()
	s1, err := b.CreateSession(ctx, "s1", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.CreateSession(ctx, "s2", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return s1, s2
}

// waitDeadlocks waits until PostgreSQL has counted n deadlocks in this
// test's database since it counted before: the test did make its
// statements deadlock. A backend reports them when it is next idle.
func waitDeadlocks(t *testing.T, ctx context.Context, b *Backend, before, n int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := countDeadlocks(t, ctx, b) - before
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL counted %d deadlocks, want %d: the test did not make its statements deadlock", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countDeadlocks is PostgreSQL's count of deadlocks in this test's database.
func countDeadlocks(t *testing.T, ctx context.Context, b *Backend) int64 {
	t.Helper()
	var n int64
	if _, err := b.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
