package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/migrations"
)

// TestMigrateCLI runs `payouts migrate` against a PostgreSQL server started
// outside the binary, twice for each database (idempotent), and checks the
// clear errors for a wrong --db and a missing --database-url.
func TestMigrateCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(t.TempDir(), "pg")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	for _, db := range []string{"paydb", "proxydb", "lockdb"} {
		if err := pg.CreateDatabase(ctx, db, ""); err != nil {
			t.Fatal(err)
		}
		for run := 1; run <= 2; run++ {
			out, errOut, code := runCLI(t, nil, "migrate", "--db", db, "--database-url", pg.URL(db))
			if code != 0 || !strings.Contains(out, db+" migrated to version") {
				t.Fatalf("migrate %s (run %d): exit %d\nstdout: %s\nstderr: %s", db, run, code, out, errOut)
			}
		}
	}
	// --grant-to gives an existing role what serving needs, and the role
	// then reads as unprivileged; a name it would have to quote is a usage
	// error, a role that does not exist or is a superuser is refused.
	if err := pg.CreateRole(ctx, "serve_pay"); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runCLI(t, nil, "migrate", "--db", "paydb", "--database-url", pg.URL("paydb"), "--grant-to", "serve_pay", "-o", "json"); code != 0 || !strings.Contains(out, `"granted_to": "serve_pay"`) {
		t.Fatalf("migrate --grant-to serve_pay: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if priv, why, err := migrations.Privileged(ctx, pg.RoleURL("serve_pay", "paydb"), ""); err != nil || priv {
		t.Fatalf("serve_pay after --grant-to: privileged %v (%s), %v", priv, why, err)
	}
	for role, want := range map[string]int{"Bad-Name": 2, "no_such_role": 1, "postgres": 1} {
		if _, errOut, code := runCLI(t, nil, "migrate", "--db", "paydb", "--database-url", pg.URL("paydb"), "--grant-to", role); code != want || errOut == "" {
			t.Fatalf("migrate --grant-to %s: exit %d (want %d), stderr %q", role, code, want, errOut)
		}
	}
	// The environment variable form of the flag works too.
	out, errOut, code := runCLI(t, []string{"PAYOUTS_DATABASE_URL=" + pg.URL("paydb")}, "migrate", "--db", "paydb")
	if code != 0 {
		t.Fatalf("migrate with PAYOUTS_DATABASE_URL: exit %d\n%s%s", code, out, errOut)
	}
	// A database holding another role's schema is refused.
	if _, errOut, code := runCLI(t, nil, "migrate", "--db", "proxydb", "--database-url", pg.URL("paydb")); code == 0 {
		t.Fatal("migrating paydb's database as proxydb succeeded")
	} else if errOut == "" {
		t.Fatal("refusal printed no reason")
	}
	if _, errOut, code := runCLI(t, nil, "migrate", "--db", "ledger", "--database-url", pg.URL("paydb")); code != 2 || !strings.Contains(errOut, "paydb, proxydb or lockdb") {
		t.Fatalf("unknown --db: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := runCLI(t, []string{"PAYOUTS_DATABASE_URL="}, "migrate", "--db", "paydb"); code != 2 || !strings.Contains(errOut, "--database-url") {
		t.Fatalf("missing --database-url: exit %d, stderr %q", code, errOut)
	}

	if _, errOut, code := runCLI(t, nil, "migrate", "--db", "paydb", "--database-url", pg.URL("paydb"), "--timeout", "-1s"); code != 2 || !strings.Contains(errOut, "cannot be negative") {
		t.Fatalf("negative --timeout: exit %d, stderr %q", code, errOut)
	}

	// A migration waiting for a lock that a long transaction holds gives up
	// its wait after --lock-timeout and tries again, until --timeout.
	proxy, err := pgx.Connect(ctx, pg.URL("proxydb"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close(ctx)
	// proxydb back at version 2: 00005, 00004 and 00003 undone, newest first.
	if _, err := proxy.Exec(ctx, `DROP TRIGGER rail_submission_resolvable_after_fixed ON rail_submission;
		DROP FUNCTION rail_submission_resolvable_after_fixed();
		CREATE INDEX rail_submission_payout_bytes_idx ON rail_submission (payout_id COLLATE "C", id)
			INCLUDE (account_id, fence_token, holder, outcome, resolution);
		DROP INDEX rail_submission_digest_idx;
		ALTER TABLE rail_submission DROP COLUMN resolvable_after;
		DELETE FROM goose_db_version WHERE version_id IN (3, 4, 5)`); err != nil {
		t.Fatal(err)
	}
	readTx, err := proxy.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readTx.Exec(ctx, `SELECT count(*) FROM rail_submission`); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = runCLI(t, nil, "migrate", "--db", "proxydb", "--database-url", pg.URL("proxydb"), "--lock-timeout", "200ms", "--timeout", "15s")
	if code != 1 || !strings.Contains(errOut, "trying again") || !strings.Contains(errOut, "waited for a table lock") || !strings.Contains(errOut, "migration 3)") {
		t.Fatalf("migrate while a transaction holds the table: exit %d, stderr %q; want exit 1 after retries, the lock wait named", code, errOut)
	}
	if err := readTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runCLI(t, nil, "migrate", "--db", "proxydb", "--database-url", pg.URL("proxydb")); code != 0 {
		t.Fatalf("migrate once the transaction ended: exit %d\n%s%s", code, out, errOut)
	}

	// A server refuses a schema older than its own instead of reporting
	// ready and failing every call.
	latest, err := migrations.Latest(migrations.PayDB)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pg.URL("paydb"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = $1`, latest); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	serve := exec.CommandContext(sctx, proctest.Binary(t), "serve", "payment", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--database-url", pg.URL("paydb"))
	var stderr strings.Builder
	serve.Stderr = &stderr
	err = serve.Run()
	want := fmt.Sprintf("paydb is at schema version %d and this binary needs %d", latest-1, latest)
	if sctx.Err() != nil || err == nil || !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "payouts migrate --db paydb") {
		t.Fatalf("serve payment on a schema one version behind: %v (still running: %v), stderr %q; want a refusal saying %q", err, sctx.Err() != nil, stderr.String(), want)
	}
}

// TestServersRefuseToStartWithoutAuth: neither --auth-file nor
// --insecure-no-auth is a start-up error, for every server role.
func TestServersRefuseToStartWithoutAuth(t *testing.T) {
	for _, role := range [][]string{
		{"serve", "rail"},
		{"serve", "lock", "--backend", "etcd", "--etcd-endpoints", "http://127.0.0.1:1"},
		{"serve", "payment", "--database-url", "postgres://127.0.0.1:1/x"},
		{"serve", "proxy", "--database-url", "postgres://127.0.0.1:1/x"},
	} {
		args := append(append([]string{}, role...), "--listen", "127.0.0.1:0")
		_, errOut, code := runCLI(t, nil, args...)
		if code == 0 || !strings.Contains(errOut, "--auth-file") {
			t.Errorf("%v without auth: exit %d, stderr %q", role, code, errOut)
		}
	}
}
