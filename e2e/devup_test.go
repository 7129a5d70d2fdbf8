package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
)

// startDevUp runs `payouts dev up --json` and returns the process and its ready line.
func startDevUp(t *testing.T, dir string, portBase int) (*exec.Cmd, stack.Ready, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(proctest.Binary(t), "dev", "up", "--dir", dir, "--json", "--port-base", strconv.Itoa(portBase))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = &syncWriter{w: stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var ready stack.Ready
	select {
	case line, ok := <-lines:
		if !ok {
			_ = cmd.Wait()
			t.Fatalf("dev up printed no ready line; stderr:\n%s", stderr.String())
		}
		if err := json.Unmarshal([]byte(line), &ready); err != nil {
			t.Fatalf("ready line is not JSON: %v\n%s", err, line)
		}
		var raw map[string]any
		_ = json.Unmarshal([]byte(line), &raw)
		for _, k := range []string{"lock_url", "payment_url", "proxy_url", "rail_url", "tokens", "database_urls", "pids"} {
			if _, ok := raw[k]; !ok {
				t.Fatalf("ready line lacks %q: %s", k, line)
			}
		}
	case <-time.After(4 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("no ready line after 4 minutes; stderr:\n%s", stderr.String())
	}
	return cmd, ready, stderr
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

func TestDevUpReadyStopRestart(t *testing.T) {
	dir := t.TempDir()
	cmd, ready, stderr := startDevUp(t, dir, 0)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dev up stderr:\n%s", stderr.String())
			for role, path := range ready.Logs {
				b, _ := os.ReadFile(path)
				t.Logf("--- %s log ---\n%s", role, tailLines(string(b), 20))
			}
		}
	})
	// Every role answers, and the generated tokens authenticate.
	for _, u := range []string{ready.LockURL, ready.PaymentURL, ready.ProxyURL, ready.RailURL} {
		resp, err := http.Get(u + "/readyz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s/readyz: %v", u, err)
		}
		resp.Body.Close()
	}
	req, _ := http.NewRequest(http.MethodGet, ready.PaymentURL+"/v1/accounts", nil)
	req.Header.Set("Authorization", "Bearer "+ready.Tokens.Operator)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /v1/accounts with the operator token: %v %v", err, resp)
	}
	resp.Body.Close()
	for _, role := range []string{"lock", "payment", "proxy", "rail", "postgres"} {
		if ready.PIDs[role] == 0 {
			t.Fatalf("ready line has no pid for %s: %v", role, ready.PIDs)
		}
	}

	// SIGTERM stops everything cleanly: exit 0, no process left behind.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Fatalf("dev up exited with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("dev up did not stop within 2 minutes of SIGTERM")
	}
	deadline := time.Now().Add(30 * time.Second)
	for role, pid := range ready.PIDs {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(pid) {
			t.Fatalf("%s (pid %d) still running after dev up stopped", role, pid)
		}
	}

	// A second run on the same directory reuses its data and tokens.
	cmd2, ready2, _ := startDevUp(t, dir, 0)
	defer func() { _ = cmd2.Process.Signal(syscall.SIGTERM); _ = cmd2.Wait() }()
	if ready2.Tokens != ready.Tokens {
		t.Fatal("second run generated new tokens instead of reusing DIR/auth.json")
	}
}

func TestDevUpPortTakenIsAClearError(t *testing.T) {
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	base := port - 1 // the lock service's port (+1) is the taken one
	l, err := listenTCP(port)
	if err != nil {
		t.Skipf("could not hold port %d: %v", port, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, proctest.Binary(t), "dev", "up", "--dir", t.TempDir(), "--json", "--port-base", strconv.Itoa(base)).CombinedOutput()
	if err == nil {
		t.Fatalf("dev up started on a taken port:\n%s", out)
	}
	if !strings.Contains(string(out), "already in use") {
		t.Fatalf("error does not say the port is in use:\n%s", out)
	}
}
