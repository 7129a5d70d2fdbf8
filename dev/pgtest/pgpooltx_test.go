package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/payouts/payouts/internal/pgpool"
)

// internal/pgpool's Tx is tested here, against real PostgreSQL: plumbing's
// own tests may not import dev tooling (dev/archtest).

func TestMain(m *testing.M) {
	code := Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

type txEnv struct {
	pool *pgxpool.Pool
	rt   *RoundTrips
	// check reads without tracing.
	check *pgx.Conn
}

func newTxEnv(t *testing.T) txEnv {
	t.Helper()
	url := EmptyDB(t)
	e := txEnv{rt: &RoundTrips{}, check: Conn(t, url)}
	e.pool = e.rt.Pool(t, url)
	if _, err := e.check.Exec(ctxT(t), `
		CREATE TABLE parent (id int PRIMARY KEY);
		CREATE TABLE item (id int PRIMARY KEY, parent int REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	return e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e txEnv) items(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.check.QueryRow(ctxT(t), `SELECT count(*) FROM item`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// noneInTransaction fails unless every connection is back in the pool and
// none of them — and no server session — is inside a transaction.
func (e txEnv) noneInTransaction(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	// A destroyed connection counts as acquired until it has closed.
	for e.pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections not given back", e.pool.Stat().AcquiredConns())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range e.pool.AcquireAllIdle(ctxT(t)) {
		st := c.Conn().PgConn().TxStatus()
		c.Release()
		if st != 'I' {
			t.Fatalf("a pooled connection is in transaction status %q", st)
		}
	}
	for {
		var open int
		if err := e.check.QueryRow(ctxT(t), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d server sessions still inside a transaction", open)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func batch(sqls ...string) *pgx.Batch {
	b := &pgx.Batch{}
	for _, s := range sqls {
		b.Queue(s)
	}
	return b
}

// twoBatches runs a guard-then-write transaction: the first batch (BEGIN
// rides in front), then the second with COMMIT behind it. It returns the
// first batch's value, Close's error and Commit's.
func twoBatches(ctx context.Context, pool *pgxpool.Pool, second *pgx.Batch) (int, error, error) {
	tx, err := pgpool.Begin(ctx, pool)
	if err != nil {
		return 0, nil, err
	}
	defer tx.Rollback(ctx)
	br := tx.SendBatch(ctx, batch(`INSERT INTO parent VALUES (1) ON CONFLICT DO NOTHING`, `SELECT 41 + 1`))
	if _, err := br.Exec(); err != nil {
		return 0, nil, err
	}
	var v int
	if err := br.QueryRow().Scan(&v); err != nil {
		return 0, nil, err
	}
	if err := br.Close(); err != nil {
		return 0, nil, err
	}
	tx.CommitAfterNextBatch()
	closeErr := tx.SendBatch(ctx, second).Close()
	return v, closeErr, tx.Commit(ctx)
}

// A transaction of two batches commits in two round trips: BEGIN in front
// of the first, COMMIT behind the second.
func TestTxCommitsInTwoRoundTrips(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	// Warm the connection's statement cache: a first use describes.
	if _, _, err := twoBatches(ctx, e.pool, batch(`INSERT INTO item VALUES (1, 1)`)); err != nil {
		t.Fatal(err)
	}
	e.rt.Reset()
	v, closeErr, err := twoBatches(ctx, e.pool, batch(`INSERT INTO item VALUES (2, 1)`))
	if v != 42 || closeErr != nil || err != nil {
		t.Fatalf("value %d, close %v, commit %v", v, closeErr, err)
	}
	if n := e.rt.Count(); n != 2 {
		t.Fatalf("round trips: %d, want 2", n)
	}
	if n := e.items(t); n != 2 {
		t.Fatalf("items: %d, want 2 committed", n)
	}
	e.noneInTransaction(t)
}

// Returning early — a decision not to write — rolls back what the first
// batch did.
func TestTxRollsBackOnEarlyReturn(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	func() {
		tx, err := pgpool.Begin(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.SendBatch(ctx, batch(`INSERT INTO parent VALUES (1)`, `INSERT INTO item VALUES (1, 1)`)).Close(); err != nil {
			t.Fatal(err)
		}
	}()
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0 (rolled back)", n)
	}
	// Results left unread and open: the connection is busy, so it is
	// destroyed rather than given back.
	func() {
		tx, err := pgpool.Begin(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		_ = tx.SendBatch(ctx, batch(`INSERT INTO parent VALUES (1)`, `INSERT INTO item VALUES (1, 1)`))
	}()
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0 (rolled back)", n)
	}
	e.noneInTransaction(t)
}

// A statement that fails in the last batch stops the COMMIT behind it: the
// batch's Close and Commit both report it, and nothing is committed.
func TestTxFailedStatementMidBatchRollsBack(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	_, closeErr, err := twoBatches(ctx, e.pool, batch(`INSERT INTO item VALUES (1, 1)`, `SELECT 1/0`, `INSERT INTO item VALUES (2, 1)`))
	var pgErr *pgconn.PgError
	if !errors.As(closeErr, &pgErr) || pgErr.Code != "22012" || err == nil {
		t.Fatalf("close %v, commit %v: want division_by_zero from both", closeErr, err)
	}
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0", n)
	}
	// The same with the caller reading the results one by one.
	func() {
		tx, err := pgpool.Begin(ctx, e.pool)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		tx.CommitAfterNextBatch()
		br := tx.SendBatch(ctx, batch(`INSERT INTO parent VALUES (7)`, `INSERT INTO parent VALUES (7)`))
		if _, err := br.Exec(); err != nil {
			t.Fatal(err)
		}
		if _, err := br.Exec(); err == nil {
			t.Fatal("duplicate key: want an error")
		}
		if _, err := br.Exec(); err == nil {
			t.Fatal("read past the caller's statements: want an error")
		}
		if br.Close() == nil || tx.Commit(ctx) == nil {
			t.Fatal("want the failure from Close and Commit")
		}
	}()
	var parents int
	if err := e.check.QueryRow(ctx, `SELECT count(*) FROM parent`).Scan(&parents); err != nil || parents != 0 {
		t.Fatalf("parents: %d %v, want 0", parents, err)
	}
	e.noneInTransaction(t)
}

// A COMMIT the server refuses (a deferred constraint checked at commit) is
// Commit's error, never a success.
func TestTxFailedCommitIsAnError(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	_, closeErr, err := twoBatches(ctx, e.pool, batch(`INSERT INTO item VALUES (1, 99)`))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23503" || closeErr == nil {
		t.Fatalf("close %v, commit %v: want the foreign key violation at commit", closeErr, err)
	}
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0", n)
	}
	// A COMMIT sent on its own after a failed statement: the server answers
	// ROLLBACK, which is pgx.ErrTxCommitRollback.
	tx, err := pgpool.Begin(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.SendBatch(ctx, batch(`INSERT INTO item VALUES (1, 1)`, `SELECT 1/0`)).Close(); err == nil {
		t.Fatal("want division_by_zero")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("commit after a failed statement: %v, want ErrTxCommitRollback", err)
	}
	e.noneInTransaction(t)
}

// A COMMIT whose answer never comes (the server session dies with the
// batch) is an error: its outcome is unknown.
func TestTxLostCommitAnswerIsAnError(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	_, closeErr, err := twoBatches(ctx, e.pool, batch(`INSERT INTO item VALUES (1, 1)`, `SELECT pg_terminate_backend(pg_backend_pid())`))
	if closeErr == nil || err == nil {
		t.Fatalf("close %v, commit %v: want both to fail", closeErr, err)
	}
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0", n)
	}
	e.noneInTransaction(t)
}

// A caller's context ending mid-batch ends the transaction: nothing is
// committed and the connection does not go back inside a transaction.
func TestTxContextCancelRollsBack(t *testing.T) {
	e := newTxEnv(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	tx, err := pgpool.Begin(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.SendBatch(ctx, batch(`INSERT INTO parent VALUES (1)`, `INSERT INTO item VALUES (1, 1)`)).Close(); err != nil {
		t.Fatal(err)
	}
	tx.CommitAfterNextBatch()
	br := tx.SendBatch(ctx, batch(`SELECT pg_sleep(60)`, `INSERT INTO item VALUES (2, 1)`))
	time.AfterFunc(200*time.Millisecond, cancel)
	closeErr := br.Close()
	err = tx.Commit(ctx)
	tx.Rollback(ctx)
	if closeErr == nil || err == nil {
		t.Fatalf("close %v, commit %v: want both to fail", closeErr, err)
	}
	if n := e.items(t); n != 0 {
		t.Fatalf("items: %d, want 0", n)
	}
	e.noneInTransaction(t)
}

// Statements sent on their own work too: BEGIN is sent first, COMMIT last.
func TestTxSingleStatements(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)
	tx, err := pgpool.Begin(ctx, e.pool)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO parent VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	var same bool
	if err := tx.QueryRow(ctx, `SELECT txid_current_if_assigned() IS NOT NULL`).Scan(&same); err != nil || !same {
		t.Fatalf("%v %v: the statements must run in one transaction", same, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("second commit: %v, want ErrTxClosed", err)
	}
	var parents int
	if err := e.check.QueryRow(ctx, `SELECT count(*) FROM parent`).Scan(&parents); err != nil || parents != 1 {
		t.Fatalf("parents: %d %v, want 1", parents, err)
	}
	e.noneInTransaction(t)
}
