package lock_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/backend/backendtest"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/pgbackend"
	"github.com/payouts/payouts/migrations"
)

const (
	executorToken  = "executor-token-0123456789"
	executor2Token = "executor-2-token-0123456789" // another principal with the executor role
	operatorToken  = "operator-token-0123456789"
)

var (
	etcdOnce    sync.Once
	etcdCluster *infra.EtcdCluster
	etcdDir     string
	etcdErr     error
	prefixSeq   atomic.Int64
)

func TestMain(m *testing.M) { backendtest.Main(m, runAll) }

func runAll(m *testing.M) int {
	code := pgtest.Main(m)
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	if etcdCluster != nil {
		etcdCluster.Close()
		os.RemoveAll(etcdDir)
	}
	return code
}

func sharedEtcd(t testing.TB) *infra.EtcdCluster {
	t.Helper()
	etcdOnce.Do(func() {
		etcdDir, etcdErr = os.MkdirTemp("", "lock-test-etcd-")
		if etcdErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		etcdCluster, etcdErr = infra.StartEtcd(ctx, etcdDir, 1)
	})
	if etcdErr != nil {
		t.Fatal(etcdErr)
	}
	return etcdCluster
}

// store is one fresh backend store (a lockdb, or an etcd prefix) that any
// number of service instances can be started on.
type store struct {
	kind      string
	url       string   // postgres
	endpoints []string // etcd
	prefix    string
}

var backends = []string{"postgres", "etcd"}

func newStore(t testing.TB, kind string) store {
	t.Helper()
	switch kind {
	case "postgres":
		return store{kind: kind, url: pgtest.NewDB(t, migrations.LockDB)}
	case "etcd":
		return store{kind: kind, endpoints: sharedEtcd(t).Endpoints(), prefix: fmt.Sprintf("/locktest/%d", prefixSeq.Add(1))}
	}
	t.Fatalf("unknown backend %s", kind)
	return store{}
}

func (s store) open(t testing.TB) backend.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	switch s.kind {
	case "postgres":
		b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: s.url, Logger: log, ReapInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return b
	default:
		cli, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: s.prefix, Logger: log, SweepInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// service is one running lock service instance.
type service struct {
	URL  string
	stop func()
	// terminate (a process started by startProcess) sends SIGTERM and
	// returns how the process exited.
	terminate func() error
}

// startService runs one lock service instance on s, stopped at test end.
func startService(t testing.TB, s store) *service {
	t.Helper()
	return startServiceOn(t, s.open(t))
}

// startServiceOn runs one lock service instance over b, stopped (and b
// closed) at test end.
func startServiceOn(t testing.TB, b backend.Backend) *service {
	t.Helper()
	a, err := auth.Parse([]byte(`{"tokens":[{"token":"` + executorToken + `","role":"executor","name":"exec-1"},` +
		`{"token":"` + executor2Token + `","role":"executor","name":"exec-2"},` +
		`{"token":"` + operatorToken + `","role":"operator","name":"alice"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	reg := obs.NewRegistry()
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("LOCK_TEST_LOG") != "" {
		log = obs.NewLogger(os.Stderr, slog.LevelWarn, "lock")
	}
	srv := httpx.NewServer(httpx.Config{Role: "lock", Addr: "127.0.0.1:0", Logger: log, Registry: reg, Auth: a, RequestTimeout: 2 * time.Minute})
	lock.NewService(b, reg, log).Mount(srv.Router())
	addr, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(ctx) }()
	go func() { defer wg.Done(); _ = b.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait(); b.Close() }) }
	t.Cleanup(stop)
	return &service{URL: "http://" + addr.String(), stop: stop}
}

// bundle is what a test of the lock service works with: a fresh store and
// one service instance on it (more can be started with startService).
type bundle struct {
	store store
	svc   *service
}

// setup builds a test's system on a fresh store of the given kind; it is
// torn down when the test ends.
func setup(t testing.TB, kind string) *bundle {
	t.Helper()
	st := newStore(t, kind)
	return &bundle{store: st, svc: startService(t, st)}
}

// blackhole is an in-process TCP proxy that can stop passing bytes while
// keeping connections open, as a network partition does.
type blackhole struct {
	ln     net.Listener
	target string
	holed  atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newBlackhole(t testing.TB, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackhole{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *blackhole) URL() string { return "http://" + p.ln.Addr().String() }

func (p *blackhole) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies until either side closes; while holed, bytes are read and
// dropped, so the peer sees silence, not a reset.
func (p *blackhole) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.holed.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (p *blackhole) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// httpClient is a client with no connection reuse across tests.
func httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 20ms for up to a minute.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
