package migrations

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A database's own defenses — the ledger's and the evidence tables'
// append-only triggers, the deferred group-sum check, the write-once
// outcome, the one-forwarded-submission index — hold only against a role
// that cannot switch them off: a superuser (session_replication_role,
// ALTER TABLE ... DISABLE TRIGGER) or the tables' owner (DROP INDEX,
// DISABLE TRIGGER, TRUNCATE) can. So the schema is migrated as its owner
// and served as a role with data privileges only (GrantServing).

// roleName is a PostgreSQL role name this package quotes itself: a plain
// identifier, so that nothing in it needs escaping.
var roleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CheckRoleName refuses a role name GrantServing would not take: it wants
// a plain lowercase identifier, which needs no quoting.
func CheckRoleName(role string) error {
	if !roleName.MatchString(role) {
		return fmt.Errorf("role %q: want a lowercase PostgreSQL identifier (a-z, 0-9, _; not starting with a digit)", role)
	}
	return nil
}

// gooseTable is where goose records the migrations applied (its default
// table name).
const gooseTable = "goose_db_version"

// GrantServing gives role what serving db needs and nothing more: to read
// and write rows (SELECT, INSERT, UPDATE, DELETE on every table of the
// schema but the migrations' record; the triggers still refuse what the
// schema forbids) and to draw from its sequences (not to set them). Not
// TRUNCATE, REFERENCES or TRIGGER, and no ownership: the role cannot
// alter, drop or disable what guards the data.
// Run it as the schema's owner after every migration (`payouts migrate
// --grant-to ROLE`): a table a migration adds is granted only then.
func GrantServing(ctx context.Context, db DB, databaseURL, role string) error {
	if err := db.valid(); err != nil {
		return err
	}
	if err := CheckRoleName(role); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("migrations: %s: connect: %w", db, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Grants change no ownership: a role that could switch the defenses
	// off is refused before anything is granted.
	switch priv, why, err := privileged(ctx, conn, role); {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("migrations: %s: role %s does not exist: create it first (CREATE ROLE %s LOGIN PASSWORD '...')", db, role, role)
	case err != nil:
		return fmt.Errorf("migrations: %s: %w", db, err)
	case priv:
		return fmt.Errorf("migrations: %s: role %s %s: it could switch off the database's own defenses; serve as a role that is no superuser and owns nothing in it", db, role, why)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	for _, stmt := range []string{
		// One grant at a time: migrators started together (an init
		// container per replica) grant the same catalog rows, and
		// concurrent GRANTs of one row fail ("tuple concurrently
		// updated").
		`SELECT pg_advisory_xact_lock(hashtext('payouts migrate --grant-to'))`,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ` + role,
		// The migrations' own record is the owner's to write: a row
		// deleted or added there makes the next migrate re-run or skip
		// a migration.
		`REVOKE INSERT, UPDATE, DELETE ON ` + gooseTable + ` FROM ` + role,
		// Drawing from a sequence (nextval) and reading it; not setval
		// (UPDATE), which moves it down: lockdb's fencing tokens issued
		// again (INV-04), the other tables' ids colliding. Revoked too
		// from a role granted it by an earlier version.
		`REVOKE UPDATE ON ALL SEQUENCES IN SCHEMA public FROM ` + role,
		`GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO ` + role,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("migrations: %s: %s: %w", db, stmt, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrations: %s: grant to %s: %w", db, role, err)
	}
	return nil
}

// Privileged reports whether role (the URL's own user when role is "")
// could switch off the database's own defenses: a superuser, or the owner
// (or a member of the owner) of a table or sequence of its schema. why
// says which.
func Privileged(ctx context.Context, databaseURL, role string) (bool, string, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return false, "", fmt.Errorf("migrations: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	priv, why, err := privileged(ctx, conn, role)
	if err != nil {
		return false, "", fmt.Errorf("migrations: %w", err)
	}
	return priv, why, nil
}

// privileged is Privileged on conn; pgx.ErrNoRows when role does not exist.
func privileged(ctx context.Context, conn *pgx.Conn, role string) (bool, string, error) {
	var (
		super  bool
		owners []string
	)
	err := conn.QueryRow(ctx, `
		SELECT r.rolsuper,
		       ARRAY(SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S') AND pg_has_role(r.oid, c.relowner, 'USAGE')
		              ORDER BY 1)
		  FROM pg_roles r WHERE r.rolname = coalesce(nullif($1, ''), current_user)`, role).Scan(&super, &owners)
	if err != nil {
		return false, "", fmt.Errorf("read the privileges of role %q: %w", role, err)
	}
	switch {
	case super:
		return true, "is a superuser", nil
	case len(owners) > 0:
		return true, fmt.Sprintf("owns the schema's tables, or is a member of their owner (%s)", strings.Join(owners, ", ")), nil
	}
	return false, "", nil
}
