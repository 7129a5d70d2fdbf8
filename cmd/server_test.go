package cmd

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/payouts/payouts/dev/proctest"
)

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7102": true, "127.0.0.2:1": true, "[::1]:7102": true, "localhost:7102": true,
		":7102": false, "0.0.0.0:7102": false, "[::]:7102": false, "10.0.0.5:7102": false,
		"example.com:7102": false, "127.0.0.1": false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %t, want %t", addr, got, want)
		}
	}
}

// "localhost" is what the resolver says it is (/etc/hosts, then DNS): it
// is loopback only when every address it resolves to is.
func TestLocalhostIsLoopbackOnlyWhereItResolvesSo(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		err   error
		want  bool
	}{
		{[]string{"127.0.0.1", "::1"}, nil, true},
		{[]string{"192.0.2.2"}, nil, false},
		{[]string{"127.0.0.1", "192.0.2.2"}, nil, false},
		{nil, nil, false},
		{nil, errors.New("no such host"), false},
	} {
		lookup := func(string) ([]string, error) { return c.addrs, c.err }
		if got := isLoopbackVia("localhost:7102", lookup); got != c.want {
			t.Errorf("localhost resolving to %v (%v): loopback %t, want %t", c.addrs, c.err, got, c.want)
		}
	}
}

// --insecure-no-auth is refused unless the server listens on loopback only.
func TestInsecureNoAuthOnlyOnLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		code, _, errOut := runArgs(t, "serve", "rail", "--insecure-no-auth", "--listen", listen)
		if code != 2 || !strings.Contains(errOut, "--insecure-no-auth is refused") {
			t.Errorf("serve rail --insecure-no-auth --listen %s: exit %d, %q; want 2 and a refusal", listen, code, errOut)
		}
	}
	// The same through the environment.
	t.Setenv("PAYOUTS_INSECURE_NO_AUTH", "true")
	t.Setenv("PAYOUTS_LISTEN", "0.0.0.0:0")
	if code, _, errOut := runArgs(t, "serve", "rail"); code != 2 || !strings.Contains(errOut, "--insecure-no-auth is refused") {
		t.Errorf("PAYOUTS_INSECURE_NO_AUTH with PAYOUTS_LISTEN=0.0.0.0:0: exit %d, %q", code, errOut)
	}
	// On loopback it starts (and stops at once: its context is done).
	t.Setenv("PAYOUTS_LISTEN", "127.0.0.1:0")
	root := NewRoot()
	root.SetArgs([]string{"serve", "rail"})
	root.SetErr(&strings.Builder{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if code := run(ctx, root, &strings.Builder{}); code != 0 {
		t.Errorf("serve rail --insecure-no-auth on 127.0.0.1: exit %d", code)
	}
}

func TestServerRefusesAnAuthFileOthersCanRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(path, []byte(`{"tokens":[{"token":"operator-token-0123456789","role":"operator","name":"op"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runArgs(t, "serve", "rail", "--auth-file", path, "--listen", "127.0.0.1:0")
	if code != 2 || !strings.Contains(errOut, "chmod 600 "+path) {
		t.Fatalf("serve rail with a 0644 auth file: exit %d, %q; want 2 and how to fix it", code, errOut)
	}
}

func TestPprofOnlyOnLoopback(t *testing.T) {
	code, _, errOut := runArgs(t, "serve", "rail", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--pprof-listen", "0.0.0.0:6060")
	if code != 2 || !strings.Contains(errOut, "--pprof-listen") {
		t.Fatalf("--pprof-listen 0.0.0.0:6060: exit %d, %q", code, errOut)
	}
}

// Secrets come from files: --token-file, --database-url-file; a flag and
// its file together are refused.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("  s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, err := secret("token", "", file); err != nil || v != "s3cret-token" {
		t.Fatalf("secret from file: %q %v", v, err)
	}
	if _, err := secret("token", "x", file); err == nil {
		t.Fatal("--token with --token-file was accepted")
	}
	// A flag or variable is trimmed the same way: a token that ends in a
	// newline is not a valid Authorization header.
	if v, err := secret("rail-token", "s3cret-token\n", ""); err != nil || v != "s3cret-token" {
		t.Fatalf("secret from a flag or variable ending in a newline: %q %v", v, err)
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	if _, err := secret("token", "", empty); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty token file: %v", err)
	}
	// A token file of two lines (a comment, a rotated token left below)
	// is refused at start, exit 2: sent, the header was invalid and every
	// request failed before it left, as if the server were down.
	twoLines := filepath.Join(dir, "two-lines")
	_ = os.WriteFile(twoLines, []byte("s3cret-token-0123456789\n# rotated 2026-12\n"), 0o600)
	if _, err := bearerSecret("rail-token", "", twoLines); err == nil || !strings.Contains(err.Error(), "one line") || !strings.Contains(err.Error(), twoLines) {
		t.Fatalf("two-line token file: %v", err)
	}
	if _, err := bearerSecret("token", "s3cret token", ""); err == nil || !strings.Contains(err.Error(), "--token (or PAYOUTS_TOKEN)") {
		t.Fatalf("a token with a space: %v", err)
	}
	code, _, errOut := runArgs(t, "payout", "list", "--payment-url", "http://127.0.0.1:1", "--token-file", twoLines)
	if code != 2 || !strings.Contains(errOut, "one line") {
		t.Fatalf("payout list with a two-line --token-file: exit %d, %q", code, errOut)
	}
	code, _, errOut = runArgs(t, "migrate", "--db", "paydb", "--database-url-file", filepath.Join(dir, "missing"))
	if code != 2 || !strings.Contains(errOut, "--database-url-file") {
		t.Fatalf("migrate with a missing --database-url-file: exit %d, %q", code, errOut)
	}
}

// Each SIGHUP runs every reload; a failing one is logged and the others
// still run.
func TestReloadOn(t *testing.T) {
	hup := make(chan os.Signal)
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan string, 8)
	done := make(chan error, 1)
	go func() {
		done <- reloadOn(ctx, hup, slog.New(slog.DiscardHandler), map[string]func() error{
			"auth": func() error { calls <- "auth"; return nil },
			"tls":  func() error { calls <- "tls"; return errors.New("broken key") },
		})
	}()
	for range 2 {
		hup <- syscall.SIGHUP
		got := map[string]bool{<-calls: true, <-calls: true}
		if !got["auth"] || !got["tls"] {
			t.Fatalf("one SIGHUP ran %v; want both reloads", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestHangupNeverEndsAServer: SIGHUP reloads a server's auth file and
// certificate; a server with neither (or one not yet running, or already
// draining) must not take SIGHUP's default action and die. Here a rail stub
// with no auth file gets SIGHUP, then SIGTERM: it must end by SIGTERM, with
// exit 0, not by SIGHUP.
func TestHangupNeverEndsAServer(t *testing.T) {
	bin := proctest.Binary(t)
	cmd := exec.Command(bin, "serve", "rail", "--insecure-no-auth", "--listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stderr)
	for lines.Scan() && !strings.Contains(lines.Text(), `"msg":"listening"`) {
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("the server ended by signal %s, want SIGTERM handled and exit 0", ws.Signal())
		}
	}
	if err != nil {
		t.Fatalf("the server ended with %v, want exit 0", err)
	}
}
