package pgbackend_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/pgbackend"
	"github.com/payouts/payouts/migrations"
)

// TestBumpTokensWaitsUntilItsCommitIsDurable: on a lockdb whose default is
// synchronous_commit = off, bump-tokens still reports success only once
// its commit is durable, as the service's own pool does: a crash right
// after it must not lose the bump. The test's cluster names a synchronous
// standby that never connects, so a commit made with synchronous_commit on
// waits (SyncRep) until it is cancelled, and one made without returns at
// once.
func TestBumpTokensWaitsUntilItsCommitIsDurable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "payouts-bump-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := infra.NewPGCluster(infra.PGOptions{Dir: dir, ExtraConf: []string{"synchronous_standby_names=nobody"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	if err := c.CreateDatabase(ctx, "lockdb", ""); err != nil {
		t.Fatal(err)
	}
	admin := pgtest.Conn(t, c.URL("postgres"))
	if _, err := admin.Exec(ctx, `ALTER DATABASE lockdb SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, migrations.LockDB, c.URL("lockdb")); err != nil {
		t.Fatal(err)
	}

	// The cluster is as described: a durable commit waits.
	probe := pgtest.Conn(t, c.URL("postgres")+"&synchronous_commit=on")
	probed := make(chan error, 1)
	go func() { _, err := probe.Exec(ctx, `CREATE TABLE sync_probe ()`); probed <- err }()
	if !waitingForStandby(t, ctx, admin, "postgres", probed) {
		t.Fatal("a commit with synchronous_commit on did not wait for the synchronous standby: the test cannot tell durable commits")
	}
	if err := <-probed; err != nil {
		t.Fatal(err)
	}

	const to = fencing.Token(1000)
	bumped := make(chan error, 1)
	go func() { _, err := pgbackend.BumpTokens(ctx, c.URL("lockdb"), to); bumped <- err }()
	if !waitingForStandby(t, ctx, admin, "lockdb", bumped) {
		t.Fatal("bump-tokens committed without waiting for its commit to be durable (synchronous_commit off): a crash could lose the bump it reported")
	}
	if err := <-bumped; err != nil {
		t.Fatalf("bump-tokens: %v", err)
	}
	var last int64
	if err := pgtest.Conn(t, c.URL("lockdb")).QueryRow(ctx, `SELECT last_value FROM lock_token_seq`).Scan(&last); err != nil || last != int64(to) {
		t.Fatalf("token sequence after the bump: %d %v; want %d", last, err, to)
	}
}

// waitingForStandby waits until a backend connected to db waits for the
// synchronous standby, and then cancels that wait (the commit stays, as
// committed locally): true. It answers false when done, the statement that
// was to wait, ends first.
func waitingForStandby(t *testing.T, ctx context.Context, admin *pgx.Conn, db string, done <-chan error) bool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return false
		default:
		}
		var pid int32
		err := admin.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'`, db).Scan(&pid)
		switch {
		case err == nil:
			if _, err := admin.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			return true
		case !errors.Is(err, pgx.ErrNoRows):
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend of %s waits for the standby, and its statement has not ended", db)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
