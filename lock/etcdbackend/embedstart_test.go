package etcdbackend_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/etcdbackend"
)

// TestEmbeddedStartsAfterAKilledFirstStart: an embedded etcd killed during
// its very first start leaves its member directory (and its snapshot
// directory) but no write-ahead log. Started again, it starts as a new
// member. Taken for an existing member, it asked peers that never knew it
// for the cluster and never started.
func TestEmbeddedStartsAfterAKilledFirstStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etcd0", "member", "snap"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, endpoints, err := etcdbackend.StartEmbedded(ctx, dir, slog.LevelInfo)
	if err != nil {
		t.Fatalf("start after a first start killed before its log: %v", err)
	}
	defer e.Close()
	if len(endpoints) != 1 {
		t.Fatalf("endpoints %v", endpoints)
	}
}
