// Package pgtest gives tests real PostgreSQL: one throwaway cluster per test
// binary, started on first use and stopped when the binary's tests finish,
// and a fresh database per test so tests never see each other's rows.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/migrations"
)

var (
	mu         sync.Mutex
	cluster    *infra.PGCluster
	clusterDir string
	templates  = map[migrations.DB]string{}
	seq        atomic.Int64
)

// Main runs the tests and then stops the shared cluster, if one was started.
func Main(m *testing.M) int {
	code := m.Run()
	mu.Lock()
	defer mu.Unlock()
	if cluster != nil {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop cluster:", err)
			if code == 0 {
				code = 1
			}
		}
		os.RemoveAll(clusterDir)
		cluster = nil
	}
	return code
}

// Cluster returns the shared cluster, starting it on first use.
func Cluster(t testing.TB) *infra.PGCluster {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if cluster != nil {
		return cluster
	}
	dir, err := os.MkdirTemp("", "payouts-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := infra.NewPGCluster(infra.PGOptions{Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("pgtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("pgtest: %v", err)
	}
	cluster, clusterDir = c, dir
	return cluster
}

func dbName(t testing.TB) string {
	name := strings.ToLower(t.Name())
	var b strings.Builder
	for _, r := range name {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return fmt.Sprintf("t%d_%s", seq.Add(1), s)
}

// EmptyDB creates a fresh database with no schema and returns its URL.
func EmptyDB(t testing.TB) string {
	t.Helper()
	c := Cluster(t)
	name := dbName(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return c.URL(name)
}

// NewDB creates a fresh database with db's migrations applied (cloned from a
// template migrated once per test binary) and returns its URL.
func NewDB(t testing.TB, db migrations.DB) string {
	t.Helper()
	c := Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tmpl, err := template(ctx, c, db)
	if err != nil {
		t.Fatalf("pgtest: template for %s: %v", db, err)
	}
	name := dbName(t)
	// CREATE DATABASE ... TEMPLATE fails if another session is connected to
	// the template; nothing connects to it after migration, so retry only on
	// that transient condition.
	for attempt := 0; ; attempt++ {
		err = c.CreateDatabase(ctx, name, tmpl)
		if err == nil || attempt > 50 || !strings.Contains(err.Error(), "being accessed by other users") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	return c.URL(name)
}

func template(ctx context.Context, c *infra.PGCluster, db migrations.DB) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if name, ok := templates[db]; ok {
		return name, nil
	}
	name := "tmpl_" + string(db)
	if err := c.CreateDatabase(ctx, name, ""); err != nil {
		return "", err
	}
	if err := migrations.Apply(ctx, db, c.URL(name)); err != nil {
		return "", err
	}
	templates[db] = name
	return name, nil
}

// Conn opens a connection to url, closed when the test ends.
func Conn(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
