package pgtest

import (
	"testing"

	"github.com/payouts/payouts/internal/problem"
)

// A database connection that is lost while a request uses it (the server
// ended its session, or went down) is answered 503 unavailable, as a
// database that cannot be reached is: the caller retries or reads back.
// It is no defect of the server, which 500 internal says.
func TestLostConnectionIsUnavailable(t *testing.T) {
	e := newTxEnv(t)
	ctx := ctxT(t)

	// The session ends under the statement that is running.
	_, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
	if err == nil {
		t.Fatal("a statement whose session ended under it succeeded")
	}
	if p := problem.From(err); p.Code != problem.Unavailable {
		t.Errorf("session ended mid-statement (%v): %s, want %s", err, p.Code, problem.Unavailable)
	}

	// The session ended before the next statement was sent on its connection.
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := e.check.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	for gone := false; !gone; {
		if err := e.check.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone); err != nil {
			t.Fatal(err)
		}
	}
	_, err = conn.Exec(ctx, `SELECT 1`)
	if err == nil {
		t.Fatal("a statement on a connection whose session had ended succeeded")
	}
	if p := problem.From(err); p.Code != problem.Unavailable {
		t.Errorf("session ended before the statement (%v): %s, want %s", err, p.Code, problem.Unavailable)
	}
}
