package lock_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// payoutsBinary builds the payouts command once per test binary.
func payoutsBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lock-test-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "payouts")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/payouts/payouts")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// startProcess runs `payouts serve lock` as a child process on s.
func startProcess(t *testing.T, s store) *service {
	t.Helper()
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(authFile, []byte(`{"tokens":[{"token":"`+executorToken+`","role":"executor","name":"exec-1"},`+
		`{"token":"`+operatorToken+`","role":"operator","name":"alice"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"serve", "lock", "--backend", s.kind, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--auth-file", authFile, "--log-level", "warn"}
	if s.kind == "postgres" {
		args = append(args, "--database-url", s.url)
	} else {
		args = append(args, "--etcd-endpoints", strings.Join(s.endpoints, ","), "--etcd-prefix", s.prefix)
	}
	cmd := exec.Command(payoutsBinary(t), args...)
	logf, err := os.Create(filepath.Join(dir, "lock.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var (
		stopOnce sync.Once
		exit     error
	)
	stop := func() {
		stopOnce.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case exit = <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				exit = fmt.Errorf("no exit within 30s of SIGTERM (killed): %v", <-done)
			}
			logf.Close()
		})
	}
	t.Cleanup(stop)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			b, _ := os.ReadFile(filepath.Join(dir, "lock.log"))
			t.Fatalf("lock service exited: %v\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("lock service process never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &service{URL: url, stop: stop, terminate: func() error { stop(); return exit }}
}

// TestTwoProcesses runs two `payouts serve lock` processes on one backend,
// with clients sending each request to either at random: mutual exclusion
// and token order hold (checked as in the linearizability test).
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the payouts binary")
	}
	payoutsBinary(t)
	forEachBackend(t, func(t *testing.T, kind string) {
		st := newStore(t, kind)
		svcs := []*service{startProcess(t, st), startProcess(t, st)}
		keys := []string{"payout:proc-1", "payout:proc-2"}
		rec := &recorder{start: time.Now()}
		const clients = 8
		var wg sync.WaitGroup
		errc := make(chan error, clients)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := runClient(t, c, svcs, keys, rec, 16); err != nil {
					errc <- fmt.Errorf("client %d: %w", c, err)
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
		checkHistory(t, "two-processes-"+kind, rec)
		checkGrantLog(t, kind, svcs[1].URL, countGrants(rec))
	})
}

// TestATermEndsWaitingAcquires: an acquire waiting for a held key (up to
// its wait_ms, here a minute) does not hold a draining lock service past
// its shutdown grace (15 s): on SIGTERM it answers lock_held at once, as if
// its wait had run out, and the process exits 0. Before, the shutdown
// waited for it, ran out of its grace and the process exited 1.
func TestATermEndsWaitingAcquires(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the payouts binary")
	}
	payoutsBinary(t)
	svc := startProcess(t, newStore(t, "postgres"))
	ctx := testCtx(t)
	a, err := lockclient.Open(ctx, svc.URL, "holder", lockclient.WithToken(executorToken))
	if err != nil {
		t.Fatal(err)
	}
	b, err := lockclient.Open(ctx, svc.URL, "waiter", lockclient.WithToken(executorToken))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*lockclient.Session{a, b} {
		defer func() { // the service is gone by then: this only stops the session's keepalives
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = s.Close(cctx)
		}()
	}
	key := fencing.Key("term")
	if _, err := a.TryAcquire(ctx, key); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, key, time.Minute)
		waited <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for proctest.Metric(t, svc.URL+"/metrics", `payouts_lock_waiters{backend="postgres"}`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the acquire never waited")
		}
		time.Sleep(20 * time.Millisecond) // polling the metric, not synchronisation
	}
	start := time.Now()
	if err := svc.terminate(); err != nil {
		t.Fatalf("after SIGTERM with an acquire waiting: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
	select {
	case err := <-waited:
		if !problem.Has(err, problem.LockHeld) {
			t.Fatalf("the waiting acquire: %v, want lock_held", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting acquire got no answer once the lock service stopped")
	}
}
