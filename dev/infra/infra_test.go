package infra_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
)

func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatalf("read postmaster.pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// processAlive reports whether pid is running. A zombie (exited, not yet
// reaped: the postmaster is re-parented to PID 1, which in a container may
// never reap) counts as gone.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func TestPostgresStartStopLeavesNothingBehind(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pid := postmasterPID(t, c.DataDir())
	if err := c.CreateDatabase(ctx, "paydb", ""); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL("paydb"))
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query: %v", err)
	}
	conn.Close(ctx)
	// A crash and restart keeps the data (the restart tests rely on it).
	if err := c.Restart(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateDatabase(ctx, "paydb", ""); err != nil { // exists: no-op
		t.Fatal(err)
	}
	pid2 := postmasterPID(t, c.DataDir())
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	// pg_ctl returns once postmaster.pid is gone, a moment before the
	// process itself has exited: allow it a generous moment.
	for _, p := range []int{pid, pid2} {
		deadline := time.Now().Add(30 * time.Second)
		for processAlive(p) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if processAlive(p) {
			t.Fatalf("postmaster %d still running after stop", p)
		}
	}
	// Port in use is a clear error.
	if infra.PortFree(c.Port) == false {
		t.Fatalf("port %d still bound after stop", c.Port)
	}
}

func TestPostgresPortTakenIsAClearError(t *testing.T) {
	dir := t.TempDir()
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&netListener{}).listen(port)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(context.Background())
	if err == nil {
		c.Stop()
		t.Fatal("start on a taken port succeeded")
	}
	if !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("unclear error: %v", err)
	}
}

func TestEtcdThreeNodeClusterLeaderLossAndClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := infra.StartEtcd(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader.Stop()
	// A new leader is elected among the remaining two and writes go on.
	newLeader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newLeader == leader {
		t.Fatal("stopped member still reported as leader")
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if _, err := cli.Put(wctx, "k", "v2"); err != nil {
		t.Fatalf("write after leader loss: %v", err)
	}
	if err := leader.Restart(ctx); err != nil {
		t.Fatalf("restart member: %v", err)
	}
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("read after restart: %v %v", err, resp)
	}
	c.Close()
	for _, n := range c.Nodes {
		if n.Running() {
			t.Fatalf("member %s still running after Close", n.Name)
		}
		port := strings.TrimPrefix(n.ClientURL, "http://127.0.0.1:")
		p, _ := strconv.Atoi(port)
		if !infra.PortFree(p) {
			t.Fatalf("member %s client port still bound after Close", n.Name)
		}
	}
}

// TestPostgresStartCancelledLeavesNoServer: a start whose caller goes away
// while the server is coming up (dev up interrupted) returns an error and
// leaves no server running, and the next start on the same directory
// succeeds.
func TestPostgresStartCancelledLeavesNoServer(t *testing.T) {
	// The cancel must land while pg_ctl waits for the server it launched;
	// a start that finished first is tried again on a fresh directory.
	for attempt := 1; ; attempt++ {
		if cancelledMidStart(t) {
			return
		}
		if attempt == 3 {
			t.Fatal("three starts finished before they saw the cancel: the test exercised nothing")
		}
	}
}

// cancelledMidStart cancels a start once the server's log appears and
// checks what it leaves; false when the start finished first.
func cancelledMidStart(t *testing.T) bool {
	t.Helper()
	dir := t.TempDir()
	c, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- c.Start(ctx) }()
	// pg_ctl creates the server's log as it launches the server.
	logFile := filepath.Join(dir, "pg", "postgres.log")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := os.Stat(logFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server's log never appeared")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-started; err == nil {
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		return false
	}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "postmaster.pid")); err == nil {
		t.Fatalf("a cancelled start left the server running (postmaster.pid %s)", filepath.Join(c.DataDir(), "postmaster.pid"))
	}
	// The next run starts on the same directory: a server left behind
	// (still coming up when the first start returned) holds its lock file.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel2()
	if err := c.Start(ctx2); err != nil {
		t.Fatalf("the next start on the same directory: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	return true
}
