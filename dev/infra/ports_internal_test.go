package infra

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// takeFirstPick holds a port bound for the test and makes it the first
// port picked; later picks are free ports. picks counts them.
func takeFirstPick(t *testing.T) (port int, picks *int) {
	t.Helper()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	port, picks = taken.Addr().(*net.TCPAddr).Port, new(int)
	pickPort = func() (int, error) {
		*picks++
		if *picks == 1 {
			return port, nil
		}
		return FreePort()
	}
	t.Cleanup(func() { pickPort = FreePort })
	return port, picks
}

// A port picked free can be bound by another process before etcd listens
// on it (tests running in parallel do exactly that): a new cluster is then
// started again on fresh ports instead of failing.
func TestEtcdStartsAgainWhenAPickedPortIsTaken(t *testing.T) {
	port, picks := takeFirstPick(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartEtcd(ctx, t.TempDir(), 1)
	if err != nil {
		t.Fatalf("start with the first picked port taken: %v", err)
	}
	defer c.Close()
	if strings.HasSuffix(c.Nodes[0].ClientURL, ":"+strconv.Itoa(port)) {
		t.Fatalf("member listens on the taken port %d", port)
	}
	if *picks < 4 {
		t.Fatalf("ports picked %d times: the start was not retried", *picks)
	}
}

// The same for a PostgreSQL cluster whose port was picked free.
func TestPostgresStartsAgainWhenAPickedPortIsTaken(t *testing.T) {
	port, picks := takeFirstPick(t)
	c, err := NewPGCluster(PGOptions{Dir: t.TempDir() + "/pg"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start with the first picked port taken: %v", err)
	}
	defer c.Stop()
	if c.Port == port || *picks < 2 {
		t.Fatalf("server on port %d after %d picks (taken: %d)", c.Port, *picks, port)
	}
}

// Each server setting goes on pg_ctl's command line once: a setting of
// ExtraConf replaces infra's own (the stack's shared_buffers=256MB was
// passed after infra's 32MB).
func TestPostgresSettingsGivenOnce(t *testing.T) {
	c := &PGCluster{opts: PGOptions{Dir: "/tmp/pg", ExtraConf: []string{"autovacuum_naptime=5s", "shared_buffers=256MB", "fsync=on"}}, Port: 5432}
	got := c.serverOptions()
	for _, want := range []string{"-c shared_buffers=256MB", "-c fsync=on", "-c max_connections=300", "-c synchronous_commit=off", "-c autovacuum_naptime=5s", "-p 5432"} {
		if !strings.Contains(got, want) {
			t.Errorf("server options %q lack %q", got, want)
		}
	}
	for _, name := range []string{"shared_buffers=", "fsync=", "max_connections="} {
		if n := strings.Count(got, "-c "+name); n != 1 {
			t.Errorf("server options %q give %s %d times, want once", got, strings.TrimSuffix(name, "="), n)
		}
	}
}
