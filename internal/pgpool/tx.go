package pgpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a transaction on one pooled connection whose BEGIN travels in
// front of its first batch and whose COMMIT travels behind its last, so a
// transaction of two batches (a guard batch, then a write batch) costs two
// round trips instead of four.
//
// Begin only acquires the connection. The first statement sent — a batch,
// or a single statement — carries BEGIN before it. CommitAfterNextBatch
// makes the next batch end with COMMIT; Commit then reports that COMMIT's
// outcome (or sends COMMIT itself when no batch carried it). Rollback,
// deferred right after Begin, ends the transaction on every other path and
// gives the connection back to the pool outside any transaction: it rolls
// back what is open, and destroys a connection it cannot bring back to idle.
//
// A COMMIT that fails, that the server answers with ROLLBACK (the
// transaction had failed), or whose answer is lost is an error, exactly as
// pgx.Tx's Commit reports it: an outcome that is not known to be a commit is
// never reported as one.
//
// Its tests, against real PostgreSQL, are in dev/pgtest (plumbing's own
// tests may not import dev tooling).
type Tx struct {
	conn        *pgxpool.Conn
	begun       bool  // BEGIN has been sent
	commitArmed bool  // the next batch ends with COMMIT
	commitSent  bool  // a batch carried COMMIT
	commitErr   error // its outcome, once its results are closed
	commitRead  bool  // commitErr is known
}

// errCommitUnread is the outcome of a COMMIT whose batch results were never
// closed: unknown, so not a commit.
var errCommitUnread = errors.New("pgpool: the batch carrying COMMIT was not closed; the commit outcome is unknown")

// rollbackTimeout bounds the ROLLBACK sent on the way out of a transaction
// whose caller's context may already be done.
const rollbackTimeout = 10 * time.Second

// Begin acquires a connection from pool for a transaction. Nothing is sent
// until the first statement. Defer Rollback at once.
func Begin(ctx context.Context, pool *pgxpool.Pool) (*Tx, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	return &Tx{conn: c}, nil
}

// CommitAfterNextBatch makes the next SendBatch end with COMMIT: the
// transaction commits when that batch runs without error. Read the batch's
// results and Close them (their Close reports a failed COMMIT), then call
// Commit for the outcome.
func (t *Tx) CommitAfterNextBatch() { t.commitArmed = true }

// SendBatch sends b in the transaction: after BEGIN if it is the first thing
// sent, followed by COMMIT if CommitAfterNextBatch asked for it. The results
// read are b's own, in order; Close drains what is unread and, when the
// batch carried COMMIT, reads its answer and returns an error unless it
// committed. BEGIN and COMMIT are queued in b itself: send b once.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.conn == nil || t.commitSent {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	n := len(b.QueuedQueries)
	withBegin := !t.begun
	if withBegin {
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: "begin"}}, b.QueuedQueries...)
		t.begun = true
	}
	withCommit := t.commitArmed
	if withCommit {
		b.Queue("commit")
		t.commitArmed, t.commitSent = false, true
	}
	r := &results{t: t, br: t.conn.SendBatch(ctx, b), n: n, commit: withCommit}
	if withBegin {
		if _, err := r.br.Exec(); err != nil {
			r.err = fmt.Errorf("begin: %w", err)
		}
	}
	return r
}

// begin sends BEGIN on its own when the first statement is not a batch.
func (t *Tx) begin(ctx context.Context) error {
	if t.conn == nil || t.commitSent {
		return pgx.ErrTxClosed
	}
	if t.begun {
		return nil
	}
	t.begun = true
	if _, err := t.conn.Exec(ctx, "begin"); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	return nil
}

// Exec runs one statement in the transaction.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

// Query runs one query in the transaction.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// QueryRow runs one query in the transaction and returns its first row.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.begin(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

// Commit commits the transaction and gives the connection back. When a
// batch carried COMMIT it sends nothing and returns that COMMIT's outcome;
// otherwise it sends COMMIT. A transaction that never sent anything has
// nothing to commit.
func (t *Tx) Commit(ctx context.Context) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	if t.commitSent {
		err := errCommitUnread
		if t.commitRead {
			err = t.commitErr
		}
		t.end()
		return err
	}
	if !t.begun {
		t.end()
		return nil
	}
	tag, err := t.conn.Exec(ctx, "commit")
	t.commitSent, t.commitRead, t.commitErr = true, true, commitOutcome(tag, err)
	err = t.commitErr
	t.end()
	return err
}

// commitOutcome is the error of a COMMIT that answered tag and err: nil only
// for a COMMIT the server confirmed.
func commitOutcome(tag pgconn.CommandTag, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("commit: %w", err)
	case tag.String() == "ROLLBACK":
		return pgx.ErrTxCommitRollback
	case tag.String() != "COMMIT":
		return fmt.Errorf("commit: unexpected answer %q", tag.String())
	}
	return nil
}

// Rollback ends the transaction unless it has been committed, and gives the
// connection back to the pool. It is a no-op once the connection is back, so
// it can always be deferred. Its ROLLBACK runs under a deadline of its own,
// not ctx's, so a caller whose context is done still leaves no transaction
// open.
func (t *Tx) Rollback(_ context.Context) error {
	if t.conn == nil {
		return nil
	}
	return t.end()
}

// end leaves the connection outside any transaction — rolling back what is
// open, destroying a connection that cannot be brought back to idle — and
// releases it.
func (t *Tx) end() error {
	c := t.conn
	t.conn = nil
	defer c.Release() // pgxpool destroys a closed or busy connection, or one still in a transaction
	pg := c.Conn().PgConn()
	if pg.IsClosed() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if pg.IsBusy() {
		// Results left open: the connection cannot take a ROLLBACK.
		return c.Conn().Close(ctx)
	}
	if pg.TxStatus() == 'I' {
		return nil
	}
	if _, err := c.Exec(ctx, "rollback"); err != nil {
		_ = c.Conn().Close(ctx)
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}

// results are a batch's results in a Tx: the caller reads its own n, and
// Close reads the COMMIT behind them.
type results struct {
	t      *Tx
	br     pgx.BatchResults
	n      int  // the caller's statements
	read   int  // of them read
	commit bool // the batch ends with COMMIT
	err    error
	closed bool
}

var errNoMoreResults = errors.New("pgpool: no more results in the batch")

// next is the error reading the next of the caller's results, if any.
func (r *results) next() error {
	switch {
	case r.err != nil:
		return r.err
	case r.closed:
		return errors.New("pgpool: batch already closed")
	case r.read >= r.n:
		return errNoMoreResults
	}
	r.read++
	return nil
}

func (r *results) Exec() (pgconn.CommandTag, error) {
	if err := r.next(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return r.br.Exec()
}

func (r *results) Query() (pgx.Rows, error) {
	if err := r.next(); err != nil {
		return nil, err
	}
	return r.br.Query()
}

func (r *results) QueryRow() pgx.Row {
	if err := r.next(); err != nil {
		return errRow{err}
	}
	return r.br.QueryRow()
}

// Tx is nil: the transaction is the Tx the batch was sent on.
func (r *results) Tx() pgx.Tx { return nil }

// Close reads what is unread and, when the batch carried COMMIT, its answer:
// the error is the first statement's error, or the COMMIT's.
func (r *results) Close() error {
	if r.closed {
		return r.err
	}
	r.closed = true
	err := r.err
	for ; err == nil && r.read < r.n; r.read++ {
		_, err = r.br.Exec()
	}
	if r.commit {
		if err == nil {
			tag, cerr := r.br.Exec()
			err = commitOutcome(tag, cerr)
		}
		if cerr := r.br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("commit: %w", cerr)
		}
		if err == nil {
			r.t.commitErr = nil
		} else {
			r.t.commitErr = fmt.Errorf("transaction not committed: %w", err)
		}
		r.t.commitRead = true
	} else if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	r.err = err
	return err
}

// errRow is a row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
