package lock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/payouts/payouts/lock/lockclient"
)

// BenchmarkAcquireRelease measures acquire+release pairs through the HTTP
// service on each backend, and raw etcd concurrency.Mutex lock+unlock as
// the baseline, in the same run. Each parallel worker has its own session
// and key (no contention: this is the cost of the protocol).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, kind := range backends {
		b.Run("service-"+kind, func(b *testing.B) {
			svc := setup(b, kind).svc
			var n atomic.Int64
			ctx := context.Background()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				id := n.Add(1)
				s, err := lockclient.Open(ctx, svc.URL, fmt.Sprintf("bench-%d", id), lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
				if err != nil {
					b.Error(err)
					return
				}
				defer s.Close(ctx)
				key := fmt.Sprintf("payout:bench-%d", id)
				for pb.Next() {
					g, err := s.TryAcquire(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					if err := s.Release(ctx, g); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("etcd-concurrency-mutex", func(b *testing.B) {
		cli, err := clientv3.New(clientv3.Config{Endpoints: sharedEtcd(b).Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Close()
		var n atomic.Int64
		ctx := context.Background()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			id := n.Add(1)
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				b.Error(err)
				return
			}
			defer s.Close()
			m := concurrency.NewMutex(s, fmt.Sprintf("/bench/mutex-%d", id))
			for pb.Next() {
				if err := m.Lock(ctx); err != nil {
					b.Error(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
