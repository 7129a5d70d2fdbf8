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

type graceRecorder struct {
	backend.NopObserver
	whys chan string
}

func (g graceRecorder) Grace(_ time.Time, why string) { g.whys <- why }

// TestStartGraceReachesTheObserver: the grace period Open starts (D-12)
// happens before the service can set its observer; it is delivered when the
// observer is set, so payouts_lock_grace_periods_total counts service starts.
func TestStartGraceReachesTheObserver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: pgtest.NewDB(t, migrations.LockDB), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rec := graceRecorder{whys: make(chan string, 4)}
	b.SetObserver(rec)
	select {
	case why := <-rec.whys:
		if why != "lock service started" {
			t.Fatalf("grace reason %q, want the service start", why)
		}
	default:
		t.Fatal("the grace period started by Open never reached the observer")
	}
	b.SetObserver(rec)
	if len(rec.whys) != 0 {
		t.Fatal("the start's grace period was delivered twice")
	}
}
