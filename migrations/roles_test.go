package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
)

// asRole is databaseURL with role as its user.
func asRole(t *testing.T, databaseURL, role string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// TestServingRoleCannotSwitchTheDefensesOff: a role given what serving a
// database needs (GrantServing) reads and writes rows, and can neither
// disable a trigger, drop the one-forwarded-submission index, truncate a
// table nor turn triggers off for its session, as the owner (here a
// superuser) can. Privileged tells the two apart.
func TestServingRoleCannotSwitchTheDefensesOff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgtest.Cluster(t)
	for _, db := range migrations.All() {
		t.Run(string(db), func(t *testing.T) {
			owner := pgtest.NewDB(t, db)
			role := "serve_" + string(db) + "_test"
			if err := c.CreateRole(ctx, role); err != nil {
				t.Fatal(err)
			}
			if priv, why, err := migrations.Privileged(ctx, owner, ""); err != nil || !priv {
				t.Fatalf("the owner's URL: privileged %v (%s), %v; want privileged", priv, why, err)
			}
			if priv, _, err := migrations.Privileged(ctx, owner, role); err != nil || priv {
				t.Fatalf("role %s before the grant: privileged %v, %v", role, priv, err)
			}
			if err := migrations.GrantServing(ctx, db, owner, role); err != nil {
				t.Fatal(err)
			}
			serving := asRole(t, owner, role)
			if priv, why, err := migrations.Privileged(ctx, serving, ""); err != nil || priv {
				t.Fatalf("the serving role: privileged %v (%s), %v; want not", priv, why, err)
			}
			conn, err := pgx.Connect(ctx, serving)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			table := map[migrations.DB]string{migrations.PayDB: "ledger_entry", migrations.ProxyDB: "rail_submission", migrations.LockDB: "lock_grant"}[db]
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
				t.Fatalf("the serving role cannot read %s: %v", table, err)
			}
			refused := []string{
				`ALTER TABLE ` + table + ` DISABLE TRIGGER ALL`,
				`TRUNCATE ` + table,
				`SET session_replication_role = replica`,
				`DROP TABLE ` + table,
			}
			if db == migrations.ProxyDB {
				refused = append(refused, `DROP INDEX rail_submission_one_forwarded_per_payout`)
			}
			// A sequence moved down re-issues its numbers: lockdb's fencing
			// tokens (INV-04), the others' row ids. Drawing is all serving
			// needs.
			rows, err := conn.Query(ctx, `SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(seqs) == 0 {
				t.Fatalf("the schema's sequences: %v %v", seqs, err)
			}
			refused = append(refused, `DELETE FROM goose_db_version`, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (999999, true)`)
			for _, seq := range seqs {
				refused = append(refused, `SELECT setval('`+seq+`', 1)`)
				if _, err := conn.Exec(ctx, `SELECT nextval('`+seq+`')`); err != nil {
					t.Errorf("the serving role cannot draw from %s: %v", seq, err)
				}
				if _, err := conn.Exec(ctx, `SELECT last_value, is_called FROM `+seq); err != nil {
					t.Errorf("the serving role cannot read %s (the lock service reads its token sequence so): %v", seq, err)
				}
			}
			for _, stmt := range refused {
				_, err := conn.Exec(ctx, stmt)
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "42501" {
					t.Errorf("%s as the serving role: %v; want refused (42501 insufficient_privilege)", stmt, err)
				}
			}
		})
	}
}

// GrantServing refuses a role that could switch the defenses off anyway,
// one that does not exist, and a name it would have to quote.
func TestGrantServingRefusesPrivilegedOrUnknownRoles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	owner := pgtest.NewDB(t, migrations.PayDB)
	for role, want := range map[string]string{
		"postgres":          "superuser",
		"no_such_role_here": "does not exist",
		`bad"name`:          "lowercase PostgreSQL identifier",
		"Capital":           "lowercase PostgreSQL identifier",
	} {
		if err := migrations.GrantServing(ctx, migrations.PayDB, owner, role); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("GrantServing to %q: %v; want an error saying %q", role, err, want)
		}
	}
}

// TestGrantServingConcurrently: migrators started together (an init
// container per replica, each with --grant-to) all succeed.
func TestGrantServingConcurrently(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgtest.Cluster(t)
	for round := range 5 {
		owner := pgtest.NewDB(t, migrations.PayDB)
		role := fmt.Sprintf("serve_concurrent_%d", round)
		if err := c.CreateRole(ctx, role); err != nil {
			t.Fatal(err)
		}
		const migrators = 8
		errs := make(chan error, migrators)
		var wg sync.WaitGroup
		for range migrators {
			wg.Go(func() { errs <- migrations.GrantServing(ctx, migrations.PayDB, owner, role) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
}
