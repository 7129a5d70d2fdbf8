package bench

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/lockclient"
)

const benchToken = "bench-executor-token-0123456789"

// lockService is the lock service running in this process over HTTP on
// loopback, exactly as `payouts serve lock` mounts it.
type lockService struct {
	url  string
	stop func()
}

func startService(ctx context.Context, b backend.Backend, log *slog.Logger) (*lockService, error) {
	a, err := auth.Parse([]byte(`{"tokens":[{"token":"` + benchToken + `","role":"executor","name":"bench"}]}`))
	if err != nil {
		return nil, err
	}
	reg := obs.NewRegistry()
	srv := httpx.NewServer(httpx.Config{Role: "lock", Addr: "127.0.0.1:0", Logger: log, Registry: reg, Auth: a,
		RequestTimeout: time.Minute})
	lock.NewService(b, reg, log).Mount(srv.Router())
	addr, err := srv.Listen()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(ctx) }()
	go func() { defer wg.Done(); _ = b.Run(ctx) }()
	return &lockService{url: "http://" + addr.String(), stop: func() { cancel(); wg.Wait() }}, nil
}

// serviceSystem drives the lock service: one session per client, each
// acquiring and releasing its own key.
type serviceSystem struct {
	url      string
	sessions []*lockclient.Session
}

func (s *serviceSystem) prepare(ctx context.Context, clients int) error {
	for i := range clients {
		x, err := lockclient.Open(ctx, s.url, fmt.Sprintf("bench-%d", i), lockclient.WithToken(benchToken),
			lockclient.WithTTL(30*time.Second), lockclient.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			return fmt.Errorf("open session: %w", err)
		}
		s.sessions = append(s.sessions, x)
	}
	return nil
}

func (s *serviceSystem) pair(ctx context.Context, c int) (time.Duration, error) {
	x := s.sessions[c]
	start := time.Now()
	g, err := x.TryAcquire(ctx, fmt.Sprintf("bench:%d", c))
	lat := time.Since(start)
	if err != nil {
		return lat, fmt.Errorf("acquire: %w", err)
	}
	if err := x.Release(ctx, g); err != nil {
		return lat, fmt.Errorf("release: %w", err)
	}
	return lat, nil
}

func (s *serviceSystem) finish(ctx context.Context) error {
	for _, x := range s.sessions {
		_ = x.Close(ctx)
	}
	return nil
}

// heapPerSession opens n sessions through the service at url (plain HTTP
// calls: the caller keeps nothing per session) and returns how much the
// process's live heap grew per session while they are all live.
func heapPerSession(ctx context.Context, url string, n int) (float64, error) {
	c, err := httpx.NewClient(url, benchToken, httpx.WithTimeout(time.Minute))
	if err != nil {
		return 0, err
	}
	before := liveHeap()
	const workers = 8
	errs := make(chan error, workers)
	ids := make(chan string, n)
	for w := range workers {
		go func() {
			for i := w; i < n; i += workers {
				var info lockclient.SessionInfo
				if err := c.Post(ctx, "/v1/sessions", lockclient.CreateSessionRequest{Owner: "mem", TTLMS: backend.MaxTTL.Milliseconds()}, &info); err != nil {
					errs <- err
					return
				}
				ids <- info.SessionID
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	close(ids)
	after := liveHeap()
	per := float64(int64(after)-int64(before)) / float64(n)
	// Close them again (the store may be shared).
	for id := range ids {
		_ = c.Delete(ctx, "/v1/sessions/"+id, nil)
	}
	return lockRound1(per), nil
}

func liveHeap() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
