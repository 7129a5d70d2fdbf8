// Package migrations holds the SQL schema of the three PostgreSQL databases
// (paydb, proxydb, lockdb), embedded in the binary, and applies it with goose.
//
// Each database has its own directory of goose-annotated SQL files. Apply is
// idempotent and safe to run from several processes at once: goose holds a
// PostgreSQL session-level advisory lock while it migrates. goose's global
// state (registered Go migrations, global dialect, base FS) is never used.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	// Also registers the "pgx" database/sql driver.
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed paydb/*.sql proxydb/*.sql lockdb/*.sql
var files embed.FS

// DB names one of the three databases, and the migration set that builds it.
type DB string

const (
	PayDB   DB = "paydb"   // the payment resource's store
	ProxyDB DB = "proxydb" // the rail proxy's store
	LockDB  DB = "lockdb"  // the lock service's PostgreSQL backend
)

// All lists every database, in a stable order.
func All() []DB { return []DB{PayDB, ProxyDB, LockDB} }

// versionTable is goose's bookkeeping table (goose's default name).
const versionTable = goose.DefaultTablename

// markerTable is a table only that database's schema creates; Apply and
// Version use it to refuse a database that already holds another schema.
var markerTable = map[DB]string{
	PayDB:   "ledger_entry",
	ProxyDB: "rail_submission",
	LockDB:  "lock_grant",
}

// Parse maps a name (as given to `payouts migrate --db`) to a DB.
func Parse(s string) (DB, error) {
	for _, db := range All() {
		if s == string(db) {
			return db, nil
		}
	}
	return "", fmt.Errorf("migrations: unknown database %q (valid: %s)", s, validNames())
}

func validNames() string {
	names := make([]string, 0, len(All()))
	for _, db := range All() {
		names = append(names, string(db))
	}
	return strings.Join(names, ", ")
}

func (db DB) valid() error {
	if _, ok := markerTable[db]; !ok {
		return fmt.Errorf("migrations: unknown database %q (valid: %s)", string(db), validNames())
	}
	return nil
}

// source returns the migration files of db.
func source(db DB) (fs.FS, error) {
	if err := db.valid(); err != nil {
		return nil, err
	}
	return fs.Sub(files, string(db))
}

// Latest returns the highest migration version embedded for db: the version a
// fully migrated database reports.
func Latest(db DB) (int64, error) {
	fsys, err := source(db)
	if err != nil {
		return 0, err
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return 0, fmt.Errorf("migrations: %s: %w", db, err)
	}
	var latest int64
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			return 0, fmt.Errorf("migrations: %s: %w", db, err)
		}
		latest = max(latest, v)
	}
	if latest == 0 {
		return 0, fmt.Errorf("migrations: %s: no migrations embedded", db)
	}
	return latest, nil
}

// DefaultLockTimeout is how long a migration's statement waits for a table
// lock before the migration is rolled back and tried again.
const DefaultLockTimeout = 3 * time.Second

// Option changes how Apply migrates.
type Option func(*settings)

type settings struct {
	lockTimeout time.Duration
	log         *slog.Logger
}

// WithLockTimeout bounds how long each statement of a migration waits for a
// lock (PostgreSQL's lock_timeout, DefaultLockTimeout unless given). A
// migration that needs a table's exclusive lock queues behind a transaction
// that holds the table, and every read and write of that table then queues
// behind the migration: without a bound, one long transaction stops the role
// that uses the table. Past the bound, the migration is rolled back, the
// table's traffic goes on, and Apply tries again after a pause (1 s, doubling
// to 30 s) until ctx ends. Zero leaves the database's own setting.
func WithLockTimeout(d time.Duration) Option {
	return func(s *settings) { s.lockTimeout = d }
}

// WithLogger names where Apply says that a migration waited too long for a
// lock and will be tried again (a WARN each time; nothing is logged
// otherwise).
func WithLogger(log *slog.Logger) Option {
	return func(s *settings) { s.log = log }
}

// Apply brings the database at databaseURL up to the latest schema for db.
// Running it again, or from several processes at once, is a no-op once the
// schema is current. It refuses a database that already holds one of the
// other two schemas: each role has a database of its own. Each migration is
// one transaction; see WithLockTimeout for one that waits on a lock.
func Apply(ctx context.Context, db DB, databaseURL string, opts ...Option) error {
	set := settings{lockTimeout: DefaultLockTimeout, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&set)
	}
	fsys, err := source(db)
	if err != nil {
		return err
	}
	sqlDB, err := open(ctx, db, databaseURL, set.lockTimeout)
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	if err := checkNotOther(ctx, sqlDB, db); err != nil {
		return err
	}
	if err := checkIndexesValid(ctx, sqlDB, db, "before migrating"); err != nil {
		return err
	}
	// Retry the advisory lock every second; ctx bounds the wait (the
	// locker gives up after 10 minutes on its own).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 600))
	if err != nil {
		return fmt.Errorf("migrations: %s: %w", db, err)
	}
	p, err := newProvider(sqlDB, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrations: %s: %w", db, err)
	}
	pause := time.Second
	var waitedFor int64 // the migration that last gave up its lock wait
	for attempt := 1; ; attempt++ {
		_, err := p.Up(ctx)
		if err == nil {
			return checkIndexesValid(ctx, sqlDB, db, "after migrating")
		}
		var partial *goose.PartialError
		if !isLockTimeout(err) || !errors.As(err, &partial) || ctx.Err() != nil {
			if waitedFor != 0 {
				// Stopped in an attempt after others gave up a lock wait.
				return fmt.Errorf("migrations: %s: apply, %s: %w", db, lockWaits(waitedFor, set.lockTimeout, attempt-1), err)
			}
			return fmt.Errorf("migrations: %s: apply: %w", db, err)
		}
		waitedFor = partial.Failed.Source.Version
		set.log.Warn("a migration waited too long for a table lock, held by another transaction: rolled back, the table's traffic goes on, trying again",
			"db", string(db), "migration", partial.Failed.Source.Version, "lock_timeout", set.lockTimeout,
			"attempt", attempt, "retry_in", pause)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("migrations: %s: stopped before trying again, %s: %w", db, lockWaits(waitedFor, set.lockTimeout, attempt), ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// checkIndexesValid refuses a schema holding an invalid index: what a
// CREATE INDEX CONCURRENTLY that failed or was cancelled leaves behind
// (docs/operations.md, building an index by hand first). The migrations
// create their indexes IF NOT EXISTS, so one would take such an index for
// built, and the queries it serves would scan their tables; proxydb's
// 00004 would then drop the valid index it replaces.
func checkIndexesValid(ctx context.Context, sqlDB *sql.DB, db DB, when string) error {
	rows, err := sqlDB.QueryContext(ctx, `SELECT c.relname FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND NOT i.indisvalid ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("migrations: %s: read the indexes' validity: %w", db, err)
	}
	defer rows.Close()
	var invalid []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("migrations: %s: read the indexes' validity: %w", db, err)
		}
		invalid = append(invalid, name)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrations: %s: read the indexes' validity: %w", db, err)
	}
	if len(invalid) > 0 {
		return fmt.Errorf("migrations: %s: %s: invalid index(es) %s, left by a CREATE INDEX CONCURRENTLY that failed or was cancelled; "+
			"the migrations would take them for built: DROP INDEX CONCURRENTLY each, then build it again by hand or migrate again",
			db, when, strings.Join(invalid, ", "))
	}
	return nil
}

// lockWaits says that attempts tries gave up waiting for a table lock, the
// last in migration version.
func lockWaits(version int64, lockTimeout time.Duration, attempts int) string {
	return fmt.Sprintf("after %d attempt(s) that waited for a table lock held by another transaction past lock_timeout %s (the last in migration %d)",
		attempts, lockTimeout, version)
}

// isLockTimeout reports whether err is PostgreSQL's lock_not_available: a
// statement gave up waiting for a lock after lock_timeout.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// Version reports the schema version the database at databaseURL holds for
// db: 0 when it was never migrated. It writes nothing and does not wait for a
// migration in progress.
func Version(ctx context.Context, db DB, databaseURL string) (int64, error) {
	fsys, err := source(db)
	if err != nil {
		return 0, err
	}
	sqlDB, err := open(ctx, db, databaseURL, 0)
	if err != nil {
		return 0, err
	}
	defer sqlDB.Close()
	if err := checkNotOther(ctx, sqlDB, db); err != nil {
		return 0, err
	}
	// goose would create its version table if it were missing; a version
	// query must not change the database.
	exists, err := tableExists(ctx, sqlDB, versionTable)
	if err != nil {
		return 0, fmt.Errorf("migrations: %s: %w", db, err)
	}
	if !exists {
		return 0, nil
	}
	p, err := newProvider(sqlDB, fsys)
	if err != nil {
		return 0, fmt.Errorf("migrations: %s: %w", db, err)
	}
	current, _, err := p.GetVersions(ctx) // takes no lock
	if err != nil {
		return 0, fmt.Errorf("migrations: %s: version: %w", db, err)
	}
	return current, nil
}

func newProvider(sqlDB *sql.DB, fsys fs.FS, opts ...goose.ProviderOption) (*goose.Provider, error) {
	opts = append([]goose.ProviderOption{
		goose.WithDisableGlobalRegistry(true),
		goose.WithVerbose(false),
	}, opts...)
	return goose.NewProvider(goose.DialectPostgres, sqlDB, fsys, opts...)
}

// open connects to databaseURL; a positive lockTimeout becomes every
// session's lock_timeout.
func open(ctx context.Context, db DB, databaseURL string, lockTimeout time.Duration) (*sql.DB, error) {
	if databaseURL == "" {
		return nil, fmt.Errorf("migrations: %s: empty database URL", db)
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("migrations: %s: open: %w", db, err)
	}
	if lockTimeout > 0 {
		cfg.RuntimeParams["lock_timeout"] = strconv.FormatInt(max(lockTimeout.Milliseconds(), 1), 10)
	}
	sqlDB := stdlib.OpenDB(*cfg)
	if err := sqlDB.PingContext(ctx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("migrations: %s: connect: %w", db, err)
	}
	return sqlDB, nil
}

// ErrWrongDatabase is returned (wrapped) when the target database already
// holds another database's schema.
var ErrWrongDatabase = errors.New("database holds another schema")

func checkNotOther(ctx context.Context, sqlDB *sql.DB, db DB) error {
	for _, other := range All() {
		if other == db {
			continue
		}
		exists, err := tableExists(ctx, sqlDB, markerTable[other])
		if err != nil {
			return fmt.Errorf("migrations: %s: %w", db, err)
		}
		if exists {
			return fmt.Errorf("migrations: %s: %w: it has the %s schema (table %s); each of %s needs a database of its own",
				db, ErrWrongDatabase, other, markerTable[other], validNames())
		}
	}
	return nil
}

// tableExists reports whether name resolves to a table through the current
// search_path, as goose's unqualified version table does.
func tableExists(ctx context.Context, sqlDB *sql.DB, name string) (bool, error) {
	var exists bool
	err := sqlDB.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("look up table %s: %w", name, err)
	}
	return exists, nil
}
