package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestClientKeepsConnections: a session's acquires and releases, answered
// with a grant, a problem (lock_held, not_held) or a grant record, reuse
// the client's kept-alive connections instead of dialling per request.
func TestClientKeepsConnections(t *testing.T) {
	svc := setup(t, "postgres").svc
	p := newBlackhole(t, svc.URL[len("http://"):])
	ctx := testCtx(t)
	a, err := lockclient.Open(ctx, p.URL(), "worker-a", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := lockclient.Open(ctx, p.URL(), "worker-b", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	const pairs = 40
	for i := range pairs {
		g, err := a.TryAcquire(ctx, fencing.Key("keepalive"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.TryAcquire(ctx, fencing.Key("keepalive")); !errors.Is(err, lockclient.ErrLockHeld) {
			t.Fatalf("pair %d: other session: want ErrLockHeld, got %v", i, err)
		}
		if err := a.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx, g); !errors.Is(err, lockclient.ErrNotHeld) {
			t.Fatalf("pair %d: second release: want ErrNotHeld, got %v", i, err)
		}
	}
	p.mu.Lock()
	dialled := len(p.conns) / 2 // the proxy keeps both ends of each connection
	p.mu.Unlock()
	// Each session may use one connection for requests and one for a
	// keepalive that overlaps them; 160 requests never need more.
	if dialled > 4 {
		t.Fatalf("%d connections dialled for %d requests: connections are not kept alive", dialled, 4*pairs)
	}
}
