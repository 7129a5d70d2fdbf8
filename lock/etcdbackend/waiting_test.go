package etcdbackend_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/etcdbackend"
)

// A session that waits for a key again before the marker of its last wait
// is deleted (in the background) keeps the new wait's marker: every
// process still sees it waiting.
func TestAWaitAgainKeepsItsMarker(t *testing.T) {
	st := store{prefix: fmt.Sprintf("/test/%d", seq.Add(1))}
	b := st.Open(t).(*etcdbackend.Backend)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.CreateSession(ctx, "reconciler", "reconciler", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	first := b.Waiting(ctx, "payout:a", s.ID, until)
	second := b.Waiting(ctx, "payout:a", s.ID, until)
	first()
	cli := newClient(t)
	markers := func() int {
		resp, err := cli.Get(ctx, st.prefix+"/waiting/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return int(resp.Count)
	}
	deadline := time.Now().Add(30 * time.Second)
	for markers() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting markers are %d, want the second wait's alone", markers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for !b.WaitingFor("payout:a") {
		if time.Now().After(deadline) {
			t.Fatal("the second wait is not seen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	second()
	for markers() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting markers are %d after both waits ended, want none", markers())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
