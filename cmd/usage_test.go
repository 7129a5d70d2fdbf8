package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/executor"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/lockclient"
)

// runCtx is runArgs with the command's context.
func runCtx(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	root := NewRoot()
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetArgs(args)
	code := run(ctx, root, &stderr)
	return code, stdout.String(), stderr.String()
}

// testCtx bounds a command that, wrongly, starts a server: it then stops
// by this deadline instead of hanging the test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connCounter is a TCP listener standing in for a database or an etcd
// member: it counts the connections made to it and closes each at once,
// so a command that connects fails fast and the test sees that it did.
func connCounter(t *testing.T) (addr string, conns func() int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
	return ln.Addr().String(), n.Load
}

// requestCounter is an HTTP server that counts what it is asked and
// answers every request with an empty page.
func requestCounter(t *testing.T) (url string, requests func() []string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.String())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[],"next":""}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clearEnv keeps the test's own environment out of the flags it checks.
func clearEnv(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if v, ok := os.LookupEnv(n); ok {
			t.Setenv(n, v) // restored after the test
			if err := os.Unsetenv(n); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestServeProxyNeedsARailToken: a proxy with no credential for the rail
// turned every payout it forwarded into RAIL_AMBIGUOUS (the rail answered
// 401). It is a usage error, naming --rail-token-file, before the proxy
// connects to its database.
func TestServeProxyNeedsARailToken(t *testing.T) {
	clearEnv(t, "PAYOUTS_RAIL_TOKEN", "PAYOUTS_RAIL_TOKEN_FILE")
	db, conns := connCounter(t)
	dbURL := "postgres://payouts@" + db + "/proxydb?sslmode=disable&connect_timeout=5"
	base := []string{"serve", "proxy", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--database-url", dbURL}
	code, _, errOut := runCtx(t, testCtx(t), base...)
	if code != 2 || !strings.Contains(errOut, "--rail-token-file") || conns() != 0 {
		t.Fatalf("serve proxy without a rail token: exit %d, %d database connections, %q; want exit 2 naming --rail-token-file, before connecting", code, conns(), errOut)
	}
	// An empty value, from the environment too, is no credential either.
	t.Setenv("PAYOUTS_RAIL_TOKEN", "")
	if code, _, errOut := runCtx(t, testCtx(t), base...); code != 2 || !strings.Contains(errOut, "--rail-token-file") {
		t.Fatalf("serve proxy with PAYOUTS_RAIL_TOKEN empty: exit %d, %q; want 2", code, errOut)
	}
	// With one (a file, or the variable), it goes on to its database.
	file := writeFile(t, "rail.token", "proxy-rail-token-0123456789\n")
	for _, extra := range [][]string{{"--rail-token-file", file}, {}} {
		if len(extra) == 0 {
			t.Setenv("PAYOUTS_RAIL_TOKEN", "proxy-rail-token-0123456789")
		}
		before := conns()
		code, _, errOut := runCtx(t, testCtx(t), append(append([]string{}, base...), extra...)...)
		if code == 2 || conns() == before {
			t.Fatalf("serve proxy %v with a rail token: exit %d, %q; want it past the flags, connecting to its database", extra, code, errOut)
		}
	}
}

// TestServeProxyRefusesABadRailURL: a --rail-url no client can call was
// refused only by the proxy itself, after it had connected to its
// database (exit 1). It is a usage error naming the flag.
func TestServeProxyRefusesABadRailURL(t *testing.T) {
	db, conns := connCounter(t)
	dbURL := "postgres://payouts@" + db + "/proxydb?sslmode=disable&connect_timeout=5"
	for _, u := range []string{"bogus", "ftp://rail:7104", "http://", ""} {
		code, _, errOut := runCtx(t, testCtx(t), "serve", "proxy", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--database-url", dbURL,
			"--rail-token", "proxy-rail-token-0123456789", "--rail-url", u)
		if code != 2 || !strings.Contains(errOut, "--rail-url") || !strings.Contains(errOut, "invalid URL") || conns() != 0 {
			t.Errorf("serve proxy --rail-url %q: exit %d, %d database connections, %q; want exit 2 naming --rail-url, before connecting", u, code, conns(), errOut)
		}
	}
}

// outputFormat runs the command of args as far as its run, and returns the
// output format it would print in.
func outputFormat(t *testing.T, args ...string) (code int, format, errOut string) {
	t.Helper()
	root := NewRoot()
	c, _, err := root.Find(args)
	if err != nil {
		t.Fatal(err)
	}
	format = "(not run)"
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		format = cmd.Flags().Lookup("output").Value.String()
		return nil
	}
	var stderr bytes.Buffer
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&stderr)
	root.SetArgs(args)
	code = run(context.Background(), root, &stderr)
	return code, format, stderr.String()
}

// TestCommandLineOutputFormatBeatsTheEnvironment: PAYOUTS_JSON=true made
// `reconcile --output table` print JSON. The command line wins over the
// environment, --json and --output on the same line must agree, and the
// environment alone still sets the format.
func TestCommandLineOutputFormatBeatsTheEnvironment(t *testing.T) {
	clearEnv(t, "PAYOUTS_JSON", "PAYOUTS_OUTPUT")
	var withJSON [][]string
	walk(NewRoot(), func(c *cobra.Command) {
		if c.Flags().Lookup("json") != nil {
			withJSON = append(withJSON, strings.Fields(strings.TrimPrefix(c.CommandPath(), "payouts ")))
		}
	})
	if len(withJSON) == 0 {
		t.Fatal("no command has --json")
	}
	for _, cmd := range withJSON {
		for _, c := range []struct {
			env  map[string]string
			args []string
			want string // the format, or "exit 2"
		}{
			{map[string]string{"PAYOUTS_JSON": "true"}, []string{"--output", "table"}, "table"},
			{map[string]string{"PAYOUTS_JSON": "true"}, []string{"-o", "table"}, "table"},
			{map[string]string{"PAYOUTS_OUTPUT": "json"}, []string{"--json=false"}, "table"},
			{map[string]string{"PAYOUTS_OUTPUT": "table"}, []string{"--json"}, "json"},
			{map[string]string{"PAYOUTS_JSON": "false"}, []string{"-o", "json"}, "json"},
			{nil, []string{"--json", "--output", "table"}, "exit 2"},
			{nil, []string{"--json=false", "--output", "json"}, "exit 2"},
			{map[string]string{"PAYOUTS_JSON": "true", "PAYOUTS_OUTPUT": "table"}, nil, "exit 2"},
			// Each alone, or agreeing.
			{map[string]string{"PAYOUTS_JSON": "true"}, nil, "json"},
			{map[string]string{"PAYOUTS_OUTPUT": "json"}, nil, "json"},
			{nil, []string{"--json"}, "json"},
			{nil, []string{"--json", "-o", "json"}, "json"},
			{nil, nil, "table"},
		} {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			args := append(append([]string{}, cmd...), c.args...)
			code, format, errOut := outputFormat(t, args...)
			switch {
			case c.want == "exit 2" && (code != 2 || !strings.Contains(errOut, "contradict")):
				t.Errorf("%v payouts %s: exit %d, format %s (%q); want exit 2: contradictory", c.env, strings.Join(args, " "), code, format, errOut)
			case c.want != "exit 2" && (code != 0 || format != c.want):
				t.Errorf("%v payouts %s: exit %d, format %s (%q); want %s", c.env, strings.Join(args, " "), code, format, errOut, c.want)
			}
			for k := range c.env {
				_ = os.Unsetenv(k)
			}
		}
	}
}

// operatorStub is the lock service, the payment resource and the rail
// proxy as `payout cancel|abandon` sees them: payout p-1 on account acc-1,
// whose lock another session holds. It records every request and the
// wait of every acquire.
type operatorStub struct {
	url   string
	mu    sync.Mutex
	reqs  []string
	waits []int64
}

func newOperatorStub(t *testing.T, state string) *operatorStub {
	t.Helper()
	s := &operatorStub{}
	session := `{"session_id":"s-1","owner":"op","ttl_ms":15000,"state":"ACTIVE","last_heartbeat_at":null,"expires_at":null}`
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/payouts/p-1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"p-1","account_id":"acc-1","amount":100,"currency":"EUR","beneficiary_ref":"b","state":%q,"client_ref":"po-p-1"}`, state)
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(session))
	})
	mux.HandleFunc("DELETE /v1/sessions/s-1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(strings.Replace(session, "ACTIVE", "CLOSED", 1)))
	})
	mux.HandleFunc("POST /v1/locks/{key}/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req lockclient.AcquireRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("acquire body: %v", err)
		}
		s.mu.Lock()
		s.waits = append(s.waits, req.WaitMS)
		s.mu.Unlock()
		problem.Write(w, backend.ErrHeld(r.PathValue("key"), backend.Lock{Held: true, Owner: "executor-7", SessionID: "s-9",
			ServerExpiry: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}))
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *operatorStub) requests() ([]string, []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...), append([]int64(nil), s.waits...)
}

// TestPayoutChangeWait: `payout cancel|abandon --wait` took 0 and negative
// values as 30s, and sent a wait above the lock service's longest to the
// service (400, exit 1). A negative wait, or one above 5m, is a usage
// error before anything is called; --wait 0 takes the lock only if it is
// free now.
func TestPayoutChangeWait(t *testing.T) {
	for _, verb := range []string{"cancel", "abandon"} {
		state := map[string]string{"cancel": "PENDING", "abandon": "RAIL_AMBIGUOUS"}[verb]
		change := func(s *operatorStub, extra ...string) (int, string) {
			args := append([]string{"payout", verb, "p-1", "--reason", "test", "--token", "operator-token-0123456789",
				"--lock-url", s.url, "--payment-url", s.url, "--proxy-url", s.url}, extra...)
			code, _, errOut := runArgs(t, args...)
			return code, errOut
		}
		for _, wait := range []string{"-1s", "-1ns", "5m1ms", "100h"} {
			s := newOperatorStub(t, state)
			code, errOut := change(s, "--wait", wait)
			if reqs, _ := s.requests(); code != 2 || !strings.Contains(errOut, "--wait must be") || len(reqs) != 0 {
				t.Errorf("payout %s --wait %s: exit %d, %q, requests %v; want exit 2 saying what --wait must be, nothing called", verb, wait, code, errOut, reqs)
			}
		}
		for wait, wantMS := range map[string]int64{"0": 0, "0s": 0, "": 30000, "5m": 300000, "1500ms": 1500} {
			s := newOperatorStub(t, state)
			var extra []string
			if wait != "" {
				extra = []string{"--wait", wait}
			}
			code, errOut := change(s, extra...)
			reqs, waits := s.requests()
			if code != 1 || !strings.Contains(errOut, "lock_held") || len(waits) != 1 || waits[0] != wantMS {
				t.Errorf("payout %s --wait %q: exit %d, %q, acquire waits %v (requests %v); want one acquire with wait_ms %d, and lock_held (exit 1)", verb, wait, code, errOut, waits, reqs, wantMS)
			}
		}
	}
	// A lock held names its holder, as the lock service sent it, and says
	// the lock can be waited for; it printed only "held by another session".
	s := newOperatorStub(t, "PENDING")
	code, _, errOut := runArgs(t, "payout", "cancel", "p-1", "--reason", "test", "--token", "operator-token-0123456789",
		"--lock-url", s.url, "--payment-url", s.url, "--proxy-url", s.url, "--wait", "0")
	for _, want := range []string{"lock_held (HTTP 409): lock payout:acc-1 is held by another session (by executor-7, session s-9, lease until 2030-01-02T03:04:05Z)",
		"waited 0s for it: run again with a longer --wait (at most 5m0s)", "--grant-linger"} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("payout cancel on a held lock: exit %d, %q; want exit 1 and %q", code, errOut, want)
		}
	}
	// The library refuses a negative wait; 0 is no wait, not a default.
	cfg := executor.OperatorConfig{Owner: "op", LockURL: "http://127.0.0.1:1", PaymentURL: "http://127.0.0.1:1", ProxyURL: "http://127.0.0.1:1", Wait: -time.Second}
	if _, err := executor.NewOperator(cfg); err == nil || !strings.Contains(err.Error(), "wait") {
		t.Errorf("NewOperator with Wait -1s: %v; want an error about the wait", err)
	}
	cfg.Wait = 0
	if _, err := executor.NewOperator(cfg); err != nil {
		t.Errorf("NewOperator with Wait 0: %v", err)
	}
}

// TestStatusRefusesMalformedURLs: `status --rail-url notaurl` reported the
// rail down (exit 1, "unsupported protocol scheme"); like every other
// client it refuses a malformed URL as a usage error naming the flag.
func TestStatusRefusesMalformedURLs(t *testing.T) {
	srv, requests := requestCounter(t)
	for _, flag := range []string{"lock-url", "payment-url", "proxy-url", "rail-url", "executor-url", "reconciler-url"} {
		for _, health := range []bool{false, true} {
			args := []string{"status", "--token", "operator-token-0123456789", "--timeout", "30s",
				"--lock-url", srv, "--payment-url", "", "--proxy-url", "", "--rail-url", "", "--" + flag, "notaurl"}
			if health {
				args = append(args, "--health-only")
			}
			code, _, errOut := runArgs(t, args...)
			want := fmt.Sprintf(`--%s: invalid URL "notaurl"`, flag)
			if code != 2 || !strings.Contains(errOut, want) {
				t.Errorf("payouts %s: exit %d, %q; want exit 2 and %q", strings.Join(args, " "), code, errOut, want)
			}
		}
	}
	if reqs := requests(); len(reqs) != 0 {
		t.Errorf("status with a malformed URL asked %v; want nothing asked", reqs)
	}
	// --only names a role whose URL is malformed.
	if code, _, errOut := runArgs(t, "status", "--only", "rail", "--health-only", "--rail-url", "http//rail:7104"); code != 2 || !strings.Contains(errOut, "--rail-url: invalid URL") {
		t.Errorf("status --only rail --rail-url http//rail:7104: exit %d, %q; want 2", code, errOut)
	}
}

// TestClientRangesCheckedLocally: values a service would refuse, or quietly
// replace with its default, are usage errors before anything is called:
// `lock grants --limit` outside 1..1000 (0 was the server's default) and a
// negative --after, `lock bump-tokens --to`/`--margin` outside
// 1..2^53-1, `payout create --amount` at or above 10^15.
func TestClientRangesCheckedLocally(t *testing.T) {
	srv, requests := requestCounter(t)
	dbFile := writeFile(t, "lockdb.url", "postgres://payouts@127.0.0.1:1/lockdb?sslmode=disable\n")
	tok := []string{"--token", "operator-token-0123456789"}
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--limit", append([]string{"lock", "grants", "--lock-url", srv, "--limit", "0"}, tok...)},
		{"--limit", append([]string{"lock", "grants", "--lock-url", srv, "--limit", "-1"}, tok...)},
		{"--limit", append([]string{"lock", "grants", "--lock-url", srv, "--limit", "1001"}, tok...)},
		{"--after", append([]string{"lock", "grants", "--lock-url", srv, "--after", "-1"}, tok...)},
		{"--after", append([]string{"lock", "grants", "--lock-url", srv, "--after", "9007199254740992"}, tok...)},
		{"--to", []string{"lock", "bump-tokens", "--database-url-file", dbFile, "--to", "9007199254740992"}},
		{"--to", []string{"lock", "bump-tokens", "--database-url-file", dbFile, "--to", "-5"}},
		{"--margin", append([]string{"lock", "bump-tokens", "--database-url-file", dbFile, "--from-guards", "--payment-url", srv, "--proxy-url", srv, "--margin", "0"}, tok...)},
		{"--margin", append([]string{"lock", "bump-tokens", "--database-url-file", dbFile, "--from-guards", "--payment-url", srv, "--proxy-url", srv, "--margin", "-1"}, tok...)},
		{"--margin", append([]string{"lock", "bump-tokens", "--database-url-file", dbFile, "--from-guards", "--payment-url", srv, "--proxy-url", srv, "--margin", "9007199254740992"}, tok...)},
		{"--amount", append([]string{"payout", "create", "--payment-url", srv, "--id", "p-1", "--account", "a-1", "--beneficiary", "b", "--amount", "1000000000000000"}, tok...)},
		{"--amount", append([]string{"payout", "create", "--payment-url", srv, "--id", "p-1", "--account", "a-1", "--beneficiary", "b", "--amount", "0"}, tok...)},
	} {
		code, _, errOut := runArgs(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.flag+" must be") {
			t.Errorf("payouts %s: exit %d, %q; want exit 2 saying what %s must be", strings.Join(c.args, " "), code, errOut, c.flag)
		}
	}
	// --margin with --to was ignored (the bump went to N): refused.
	if code, _, errOut := runArgs(t, "lock", "bump-tokens", "--database-url-file", dbFile, "--to", "10", "--margin", "5"); code != 2 || !strings.Contains(errOut, "--margin is for --from-guards") {
		t.Errorf("bump-tokens --to 10 --margin 5: exit %d, %q; want 2 saying --margin is for --from-guards", code, errOut)
	}
	// A value past int64 is the flag parser's usage error.
	if code, _, errOut := runArgs(t, "lock", "bump-tokens", "--database-url-file", dbFile, "--to", "99999999999999999999"); code != 2 || !strings.Contains(errOut, "--to") {
		t.Errorf("bump-tokens --to 99999999999999999999: exit %d, %q; want 2", code, errOut)
	}
	if reqs := requests(); len(reqs) != 0 {
		t.Errorf("out-of-range flags called %v; want nothing called", reqs)
	}
	// The ends of the ranges are taken.
	for _, args := range [][]string{
		append([]string{"lock", "grants", "--lock-url", srv, "--limit", "1", "-o", "json"}, tok...),
		append([]string{"lock", "grants", "--lock-url", srv, "--limit", "1000", "--after", "0", "-o", "json"}, tok...),
	} {
		if code, _, errOut := runArgs(t, args...); code != 0 {
			t.Errorf("payouts %s: exit %d, %q; want 0", strings.Join(args, " "), code, errOut)
		}
	}
}

// TestServeLockRefusesTheOtherBackendsFlags: `serve lock --backend
// postgres --etcd-embed-dir X` ignored the etcd flag without a word, and
// --backend etcd ignored --database-url. Each is a usage error naming the
// flag, before anything is started or connected.
func TestServeLockRefusesTheOtherBackendsFlags(t *testing.T) {
	clearEnv(t, "PAYOUTS_DATABASE_URL", "PAYOUTS_DATABASE_URL_FILE", "PAYOUTS_MIGRATE", "PAYOUTS_ETCD_ENDPOINTS", "PAYOUTS_ETCD_EMBED_DIR", "PAYOUTS_ETCD_PREFIX")
	db, conns := connCounter(t)
	dbURL := "postgres://payouts@" + db + "/lockdb?sslmode=disable&connect_timeout=5"
	dbFile := writeFile(t, "lockdb.url", dbURL)
	base := []string{"serve", "lock", "--insecure-no-auth", "--listen", "127.0.0.1:0"}
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--etcd-embed-dir", []string{"--backend", "postgres", "--database-url", dbURL, "--etcd-embed-dir", t.TempDir()}},
		{"--etcd-endpoints", []string{"--backend", "postgres", "--database-url", dbURL, "--etcd-endpoints", "http://" + db}},
		{"--etcd-prefix", []string{"--backend", "postgres", "--database-url", dbURL, "--etcd-prefix", "/other"}},
		{"--database-url", []string{"--backend", "etcd", "--etcd-endpoints", "http://" + db, "--database-url", dbURL}},
		{"--database-url-file", []string{"--backend", "etcd", "--etcd-endpoints", "http://" + db, "--database-url-file", dbFile}},
		{"--migrate", []string{"--backend", "etcd", "--etcd-endpoints", "http://" + db, "--migrate"}},
	} {
		// A command that, wrongly, starts the service stops at once.
		ctx, cancel := context.WithCancel(context.Background())
		if strings.Contains(c.args[1], "etcd") {
			cancel()
		}
		args := append(append([]string{}, base...), c.args...)
		code, _, errOut := runCtx(t, ctx, args...)
		cancel()
		if code != 2 || !strings.Contains(errOut, c.flag+" ") || conns() != 0 {
			t.Errorf("payouts %s: exit %d, %d connections, %q; want exit 2 naming %s, before connecting", strings.Join(args, " "), code, conns(), errOut, c.flag)
		}
	}
	// The same from the environment.
	t.Setenv("PAYOUTS_ETCD_EMBED_DIR", t.TempDir())
	args := append(append([]string{}, base...), "--backend", "postgres", "--database-url", dbURL)
	if code, _, errOut := runCtx(t, testCtx(t), args...); code != 2 || !strings.Contains(errOut, "PAYOUTS_ETCD_EMBED_DIR") || conns() != 0 {
		t.Errorf("PAYOUTS_ETCD_EMBED_DIR with --backend postgres: exit %d, %q; want exit 2 naming the variable", code, errOut)
	}
}

// TestPlainHTTPToAnHTTPSServerSaysSo: `payout show --payment-url http://...`
// of a server that serves HTTPS printed "internal (HTTP 400): HTTP 400:
// Client sent an HTTP request to an HTTPS server.". It says to use an
// https:// URL.
func TestPlainHTTPToAnHTTPSServerSaysSo(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	plain := strings.Replace(srv.URL, "https://", "http://", 1)
	code, _, errOut := runArgs(t, "payout", "show", "p-1", "--payment-url", plain, "--token", "operator-token-0123456789")
	if code == 0 || !strings.Contains(errOut, "invalid_request (HTTP 400): the server speaks HTTPS: use an https:// URL") {
		t.Fatalf("payout show over http:// to an HTTPS server: exit %d, %q; want it to say to use https://", code, errOut)
	}
}

// TestStoreAddressesCheckedFirst: `serve payment --database-url 'not a
// url'` (and the other roles with a database, and migrate) exited 1 with
// the driver's "cannot parse" from deep in the start; `serve lock
// --etcd-endpoints bogus` was taken and waited for ever. Each is a usage
// error naming where the value came from, before anything connects, and
// the driver's message does not echo a password.
func TestStoreAddressesCheckedFirst(t *testing.T) {
	clearEnv(t, "PAYOUTS_DATABASE_URL", "PAYOUTS_DATABASE_URL_FILE", "PAYOUTS_ETCD_ENDPOINTS", "PAYOUTS_ETCD_EMBED_DIR")
	server := []string{"--insecure-no-auth", "--listen", "127.0.0.1:0"}
	withDB := [][]string{
		append([]string{"serve", "payment"}, server...),
		append([]string{"serve", "proxy", "--rail-token", "proxy-rail-token-0123456789"}, server...),
		append([]string{"serve", "lock", "--backend", "postgres"}, server...),
		{"migrate", "--db", "paydb"},
		{"lock", "bump-tokens", "--to", "5"},
	}
	for _, base := range withDB {
		for _, bad := range []string{"not a url", "postgres://payouts:s3cret@127.0.0.1:notaport/paydb"} {
			args := append(append([]string{}, base...), "--database-url", bad)
			code, _, errOut := runCtx(t, testCtx(t), args...)
			if code != 2 || !strings.Contains(errOut, "--database-url must be a PostgreSQL URL") || strings.Contains(errOut, "s3cret") {
				t.Errorf("payouts %s: exit %d, %q; want exit 2 saying what --database-url must be, no password", strings.Join(args, " "), code, errOut)
			}
		}
	}
	file := writeFile(t, "db.url", "not a url\n")
	if code, _, errOut := runArgs(t, "migrate", "--db", "paydb", "--database-url-file", file); code != 2 || !strings.Contains(errOut, "the URL in --database-url-file "+file+" must be") {
		t.Errorf("migrate with a --database-url-file holding no URL: exit %d, %q; want 2 naming the file", code, errOut)
	}
	t.Setenv("PAYOUTS_DATABASE_URL", "not a url")
	if code, _, errOut := runArgs(t, "migrate", "--db", "paydb"); code != 2 || !strings.Contains(errOut, "PAYOUTS_DATABASE_URL must be") {
		t.Errorf("migrate with PAYOUTS_DATABASE_URL=not a url: exit %d, %q; want 2 naming the variable", code, errOut)
	}
	_ = os.Unsetenv("PAYOUTS_DATABASE_URL")
	for _, eps := range []string{"bogus", "127.0.0.1", "http://127.0.0.1", "ftp://127.0.0.1:2379", "127.0.0.1:2379,:2379", "http://127.0.0.1:2379/v3/x"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		code, _, errOut := runCtx(t, ctx, append(append([]string{"serve", "lock", "--backend", "etcd"}, server...), "--etcd-endpoints", eps)...)
		cancel()
		if code != 2 || !strings.Contains(errOut, "--etcd-endpoints: endpoint") || !strings.Contains(errOut, "must be host:port or http(s)://host:port") {
			t.Errorf("serve lock --etcd-endpoints %s: exit %d, %q; want exit 2 saying what an endpoint must be", eps, code, errOut)
		}
	}
	for _, ok := range []string{"127.0.0.1:2379", "etcd-1:2379", "http://etcd-1:2379", "https://[::1]:2379/", "localhost:2379"} {
		if err := checkEtcdEndpoint(ok); err != nil {
			t.Errorf("etcd endpoint %q refused: %v", ok, err)
		}
	}
}

// TestReconcileChecksItsFilesFirst: `reconcile --once --state-file
// /nonexistent/dir/x.json` (or --metrics-file there) made a whole pass
// before exiting 2 because it could not write the file. The directory is
// checked first: exit 2, naming the flag, nothing asked; the metrics file,
// where it can be written, still says the run failed.
func TestReconcileChecksItsFilesFirst(t *testing.T) {
	clearEnv(t, "PAYOUTS_STATE_FILE", "PAYOUTS_METRICS_FILE")
	srv, requests := requestCounter(t)
	dir := t.TempDir()
	notADir := writeFile(t, "plain", "")
	metrics := filepath.Join(dir, "payouts_reconcile.prom")
	base := []string{"reconcile", "--once", "--token", "reconciler-token-0123456789", "--rail-token", "rail-token-0123456789",
		"--lock-url", srv, "--payment-url", srv, "--proxy-url", srv, "--rail-url", srv}
	for _, c := range []struct {
		flag string
		args []string
		want string
	}{
		{"--state-file", []string{"--state-file", "/nonexistent/dir/x.json", "--metrics-file", metrics}, "its directory /nonexistent/dir does not exist"},
		{"--state-file", []string{"--state-file", filepath.Join(notADir, "x.json"), "--metrics-file", metrics}, notADir + " is not a directory"},
		{"--metrics-file", []string{"--metrics-file", "/nonexistent/dir/x.prom"}, "its directory /nonexistent/dir does not exist"},
	} {
		_ = os.Remove(metrics)
		args := append(append([]string{}, base...), c.args...)
		code, _, errOut := runArgs(t, args...)
		if code != 2 || !strings.Contains(errOut, "could not run: "+c.flag+" ") || !strings.Contains(errOut, c.want) {
			t.Errorf("payouts %s: exit %d, %q; want exit 2 naming %s (%s)", strings.Join(args, " "), code, errOut, c.flag, c.want)
		}
		if reqs := requests(); len(reqs) != 0 {
			t.Fatalf("payouts %s asked %v; want nothing asked", strings.Join(args, " "), reqs)
		}
		if c.flag == "--state-file" {
			if b, err := os.ReadFile(metrics); err != nil || !strings.Contains(string(b), "payouts_reconcile_up 0") {
				t.Errorf("payouts %s: metrics file %q (%v); want it written with up 0", strings.Join(args, " "), b, err)
			}
		}
	}
}
