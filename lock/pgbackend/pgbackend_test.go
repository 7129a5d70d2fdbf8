package pgbackend_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/backend/backendtest"
	"github.com/payouts/payouts/lock/pgbackend"
	"github.com/payouts/payouts/migrations"
)

func TestMain(m *testing.M) { backendtest.Main(m, pgtest.Main) }

type store struct{ url string }

func (s store) Open(t *testing.T) backend.Backend { return open(t, s.url) }

func open(t *testing.T, url string) *pgbackend.Backend {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: url, Logger: slog.New(slog.DiscardHandler), ReapInterval: 100 * time.Millisecond})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; b.Close() })
	return b
}

// setup is a test's system: a fresh, migrated lockdb.
func setup(t *testing.T) backendtest.Store { return store{url: pgtest.NewDB(t, migrations.LockDB)} }

func TestBehaviour(t *testing.T) {
	t.Parallel()
	backendtest.Run(t, setup)
}
