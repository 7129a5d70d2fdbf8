package supervise_test

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/supervise"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
)

// helperEnv makes the test binary, started as a child, act as a server:
// an httpx server on 127.0.0.1:0 until SIGTERM (exit 0), or exit 7 at once
// when the variable says "fail".
const helperEnv = "SUPERVISE_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "serve":
		os.Exit(serve())
	case "fail":
		os.Stderr.WriteString("helper: failing on purpose\n")
		os.Exit(7)
	}
	goleak.VerifyTestMain(m)
}

func serve() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	a, err := auth.FromFlags("", true)
	if err != nil {
		return 2
	}
	srv := httpx.NewServer(httpx.Config{Role: "helper", Addr: "127.0.0.1:0", Auth: a})
	if _, err := srv.Listen(); err != nil {
		return 2
	}
	if err := srv.Serve(ctx); err != nil {
		return 1
	}
	return 0
}

func start(t *testing.T, mode string) *supervise.Proc {
	t.Helper()
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "helper.addr")
	// A file left by an earlier run must not be taken for this one's.
	if err := os.WriteFile(addrFile, []byte("127.0.0.1:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := supervise.Start(supervise.Spec{Name: "helper", Path: os.Args[0], Args: []string{"-test.run=^$"},
		Env: []string{helperEnv + "=" + mode}, Log: filepath.Join(dir, "helper.log"), AddrFile: addrFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// TestAddrFileReadinessAndCleanStop: a server child reports the address it
// bound through the file it is handed, answers /readyz there, and exits 0
// when asked to stop.
func TestAddrFileReadinessAndCleanStop(t *testing.T) {
	t.Parallel()
	p := start(t, "serve")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	addr, err := p.Addr(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if addr == "127.0.0.1:1" || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("address %q is not the one the child bound", addr)
	}
	if err := p.Ready(ctx, nil, "http://"+addr); err != nil {
		t.Fatal(err)
	}
	if code := p.Stop(time.Minute); code != 0 {
		t.Fatalf("a server asked to stop exited %d; log:\n%s", code, p.Log())
	}
}

// TestChildDyingDuringStartIsOneLine: a child that exits before it
// listens is reported at once, in one line naming its log.
func TestChildDyingDuringStartIsOneLine(t *testing.T) {
	t.Parallel()
	p := start(t, "fail")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := p.Addr(ctx)
	if err == nil {
		t.Fatal("no error from a child that exited before listening")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, p.Spec.Log) || !strings.Contains(msg, "helper exited") {
		t.Fatalf("want one line naming the child and its log, got %q", msg)
	}
	// Once it has exited, its exit code is there at once, every time.
	for range 50 {
		if code, err := p.Wait(0); code != 7 || err != nil {
			t.Fatalf("Wait(0) after exit: %d, %v; want 7", code, err)
		}
	}
	if !strings.Contains(p.Log(), "failing on purpose") {
		t.Fatalf("the child's stderr is not in its log: %q", p.Log())
	}
	if err := p.Ready(ctx, nil, "http://127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("Ready of an exited child: %v", err)
	}
}
