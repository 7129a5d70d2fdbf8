package pgbackend_test

import (
	"context"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
)

// TestDatabaseIdentityIsTheSameForEveryCaller: lock services on one lockdb
// must agree on its identity (D-12), whatever their connections' TimeZone
// and DateStyle and whichever role they connect as; otherwise each sees the
// other's identity as a change and the grace period never ends, so no
// session expires.
func TestDatabaseIdentityIsTheSameForEveryCaller(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.LockDB)
	ctx := context.Background()
	admin := pgtest.Conn(t, url)
	if _, err := admin.Exec(ctx, `CREATE ROLE lock_replica LOGIN`); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	identity := func(connURL string, settings ...string) string {
		t.Helper()
		conn := pgtest.Conn(t, connURL)
		for _, s := range settings {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		var id string
		if err := conn.QueryRow(ctx, `SELECT lock_db_identity()`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	base := identity(url, `SET TimeZone = 'UTC'`, `SET DateStyle = 'ISO, MDY'`)
	for name, got := range map[string]string{
		"another time zone and date style": identity(url, `SET TimeZone = 'Asia/Tokyo'`, `SET DateStyle = 'SQL, DMY'`),
		"another role and time zone":       identity(strings.Replace(url, "postgres@", "lock_replica@", 1), `SET TimeZone = 'America/New_York'`),
	} {
		if got != base {
			t.Errorf("%s: identity %q, want %q", name, got, base)
		}
	}
}
