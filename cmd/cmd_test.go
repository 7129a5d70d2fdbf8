package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/payouts/payouts/dev/stack"
)

// runArgs runs the command line in-process and returns its exit code,
// stdout and stderr.
func runArgs(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	root := NewRoot()
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetArgs(args)
	code := run(context.Background(), root, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestVersionJSON(t *testing.T) {
	code, out, errOut := runArgs(t, "version", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var v map[string]string
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("version -o json printed %q: %v", out, err)
	}
	if len(v) != 3 || v["version"] == "" || v["revision"] == "" || v["go"] != runtime.Version() {
		t.Fatalf("version -o json = %v; want exactly version, revision and go (%s)", v, runtime.Version())
	}
	code, out, _ = runArgs(t, "version")
	if code != 0 || !strings.Contains(out, v["version"]) || !strings.Contains(out, "REVISION") {
		t.Fatalf("version (table): exit %d, %q", code, out)
	}
}

func TestOutputFormatIsChecked(t *testing.T) {
	code, _, errOut := runArgs(t, "version", "--output", "yaml")
	if code != 2 || !strings.Contains(errOut, "--output must be table or json") {
		t.Fatalf("version --output yaml: exit %d, %q; want 2 and a clear message", code, errOut)
	}
}

// walk calls fn on every command of the tree that does something: runnable
// and no group (a group, such as `payouts lock`, runs only to print its
// help or refuse an unknown subcommand).
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	if c.Runnable() && !c.HasSubCommands() {
		fn(c)
	}
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
}

// TestCommandFlags holds the command-line contract: every command that
// prints records has -o/--output, --json exists exactly where DESIGN names
// it, and each client command takes the URL of only the roles it calls.
func TestCommandFlags(t *testing.T) {
	wantURLs := map[string][]string{
		"payouts run executor":     {"lock-url", "payment-url", "proxy-url"},
		"payouts reconcile":        {"lock-url", "payment-url", "proxy-url", "rail-url"},
		"payouts payout create":    {"payment-url"},
		"payouts payout show":      {"payment-url"},
		"payouts payout list":      {"payment-url"},
		"payouts payout cancel":    {"lock-url", "payment-url", "proxy-url"}, // asks the proxy whether the payout was sent
		"payouts payout abandon":   {"lock-url", "payment-url", "proxy-url"},
		"payouts lock list":        {"lock-url"},
		"payouts lock show":        {"lock-url"},
		"payouts lock revoke":      {"lock-url"},
		"payouts lock grants":      {"lock-url"},
		"payouts lock bump-tokens": {"payment-url", "proxy-url"}, // --from-guards reads both guards' high fences
		"payouts serve proxy":      {"rail-url"},
	}
	withOutput := []string{"payouts payout", "payouts lock", "payouts version", "payouts migrate", "payouts reconcile", "payouts dev up", "payouts status", "payouts bench"}
	withJSON := map[string]bool{"payouts reconcile": true, "payouts dev up": true, "payouts bench e2e": true, "payouts bench reconcile": true, "payouts bench lock": true}
	seen := map[string]bool{}
	walk(NewRoot(), func(c *cobra.Command) {
		path := c.CommandPath()
		seen[path] = true
		var urls []string
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.HasSuffix(f.Name, "-url") && f.Name != "database-url" {
				urls = append(urls, f.Name)
			}
		})
		if want, ok := wantURLs[path]; ok && strings.Join(urls, ",") != strings.Join(want, ",") {
			t.Errorf("%s: URL flags %v, want %v", path, urls, want)
		}
		for _, prefix := range withOutput {
			if strings.HasPrefix(path, prefix) {
				if f := c.Flags().Lookup("output"); f == nil || f.Shorthand != "o" {
					t.Errorf("%s: no -o/--output flag", path)
				}
			}
		}
		if (c.Flags().Lookup("json") != nil) != withJSON[path] {
			t.Errorf("%s: --json present = %t, want %t", path, c.Flags().Lookup("json") != nil, withJSON[path])
		}
	})
	for path := range wantURLs {
		if !seen[path] {
			t.Errorf("command %q is missing from the tree", path)
		}
	}
}

// TestJSONAlias: --json is --output json.
func TestJSONAlias(t *testing.T) {
	var o output
	c := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	o.register(c, true)
	c.SetArgs([]string{"--json"})
	if err := c.Execute(); err != nil || !o.isJSON() {
		t.Fatalf("--json: err %v, json %t", err, o.isJSON())
	}
}

func TestBuildInfoGauge(t *testing.T) {
	mfs, err := newApp().registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "payouts_build_info" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || labels["goversion"] != runtime.Version() || labels["version"] == "" || labels["revision"] == "" {
			t.Fatalf("payouts_build_info = %v %v", m.GetGauge().GetValue(), labels)
		}
		return
	}
	t.Fatal("the process registry has no payouts_build_info gauge")
}

// TestClientNeedsToken: a client command without a credential stops with
// exit 2 before calling anything, naming the flags to use.
func TestClientNeedsToken(t *testing.T) {
	t.Setenv("PAYOUTS_TOKEN", "")
	t.Setenv("PAYOUTS_TOKEN_FILE", "")
	code, _, errOut := runArgs(t, "lock", "list")
	if code != 2 || !strings.Contains(errOut, "--token-file") {
		t.Fatalf("lock list without a token: exit %d, %q", code, errOut)
	}
}

// TestBothTokenVariablesNamed: PAYOUTS_TOKEN and PAYOUTS_TOKEN_FILE both
// set were refused as "--token and --token-file are mutually exclusive",
// naming flags nobody typed. The message names the variables too; so for
// the other secrets given as a value or a file.
func TestBothTokenVariablesNamed(t *testing.T) {
	file := writeFile(t, "token", "token-from-the-file-0123456789\n")
	t.Setenv("PAYOUTS_TOKEN", "token-from-the-environment-0123")
	t.Setenv("PAYOUTS_TOKEN_FILE", file)
	code, _, errOut := runArgs(t, "lock", "list", "--lock-url", "http://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut, "--token (PAYOUTS_TOKEN) and --token-file (PAYOUTS_TOKEN_FILE) are mutually exclusive") {
		t.Fatalf("lock list with PAYOUTS_TOKEN and PAYOUTS_TOKEN_FILE: exit %d, %q; want 2 naming both variables", code, errOut)
	}
	t.Setenv("PAYOUTS_DATABASE_URL", "postgres://payouts@127.0.0.1:1/paydb")
	t.Setenv("PAYOUTS_DATABASE_URL_FILE", file)
	code, _, errOut = runArgs(t, "migrate", "--db", "paydb")
	if code != 2 || !strings.Contains(errOut, "--database-url (PAYOUTS_DATABASE_URL) and --database-url-file (PAYOUTS_DATABASE_URL_FILE)") {
		t.Fatalf("migrate with PAYOUTS_DATABASE_URL and PAYOUTS_DATABASE_URL_FILE: exit %d, %q; want 2 naming both variables", code, errOut)
	}
	clearEnv(t, "PAYOUTS_DATABASE_URL", "PAYOUTS_DATABASE_URL_FILE")
	t.Setenv("PAYOUTS_ETCD_EMBED_DIR", t.TempDir())
	code, _, errOut = runCtx(t, testCtx(t), "serve", "lock", "--backend", "etcd", "--insecure-no-auth", "--listen", "127.0.0.1:0", "--etcd-endpoints", "http://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut, "--etcd-endpoints and PAYOUTS_ETCD_EMBED_DIR are mutually exclusive") {
		t.Fatalf("serve lock --etcd-endpoints with PAYOUTS_ETCD_EMBED_DIR: exit %d, %q; want 2 naming the variable", code, errOut)
	}
}

// Flags that do nothing were removed: passing one is a usage error (exit 2).
func TestRemovedFlagsAreUsageErrors(t *testing.T) {
	code, _, errOut := runArgs(t, "lock", "list", "--proxy-url", "http://127.0.0.1:7103", "--token", "x")
	if code != 2 || !strings.Contains(errOut, "unknown flag: --proxy-url") {
		t.Fatalf("lock list --proxy-url: exit %d, %q", code, errOut)
	}
}

// TestDevUpLeavesTheReconcilerPortFree: a stack from `dev up`'s default
// --port-base listens on none of the addresses the roles' own default
// --listen flags name, except each server's own: a continuous reconciler
// (`reconcile --interval ...`, default 127.0.0.1:7105) starts beside it.
func TestDevUpLeavesTheReconcilerPortFree(t *testing.T) {
	root := NewRoot()
	find := func(path ...string) *cobra.Command {
		c, _, err := root.Find(path)
		if err != nil || c.Name() != path[len(path)-1] {
			t.Fatalf("no command %v: %v", path, err)
		}
		return c
	}
	base, err := strconv.Atoi(find("dev", "up").Flags().Lookup("port-base").DefValue)
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]string{}
	for what, port := range stack.PortLayout(base) {
		used[port] = what
	}
	for _, path := range [][]string{{"reconcile"}, {"serve", "lock"}, {"serve", "payment"}, {"serve", "proxy"}, {"serve", "rail"}} {
		def := find(path...).Flags().Lookup("listen").DefValue
		_, p, err := net.SplitHostPort(def)
		if err != nil {
			t.Fatalf("%v --listen default %q: %v", path, def, err)
		}
		port, _ := strconv.Atoi(p)
		role := path[len(path)-1]
		if what, ok := used[port]; ok && what != role {
			t.Errorf("`%s` listens on %s by default, where `dev up` (--port-base %d) puts its %s", strings.Join(path, " "), def, base, what)
		}
	}
}

// TestUsageErrorsExitTwo: every way of calling the binary wrongly is a
// usage error, exit 2 — never 1, which `reconcile` uses for findings and
// `status` for a role down: unknown commands (at the root and in a group),
// wrong positional arguments, and a PAYOUTS_* value the flag cannot take.
func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"no-such-command"},
		{"lock", "no-such-command"},
		{"payout", "show"},
		{"payout", "show", "a", "b"},
		{"reconcile", "--once", "extra"},
		{"status", "extra"},
		{"lock", "show", ""},
		{"payout", "cancel", " ", "--reason", "r"},
		{"serve", "lock"},
		{"serve", "lock", "--backend", "zookeeper"},
		{"serve", "lock", "--backend", "etcd", "--insecure-no-auth"},
		{"serve", "lock", "--backend", "etcd", "--insecure-no-auth", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-embed-dir", "unused"},
		{"bench", "lock", "--duration", "1s"},
	} {
		if code, _, errOut := runArgs(t, args...); code != 2 {
			t.Errorf("payouts %s: exit %d, want 2 (%s)", strings.Join(args, " "), code, errOut)
		}
	}
	if _, _, errOut := runArgs(t, "serve", "lock"); !strings.Contains(errOut, "--backend is required") {
		t.Errorf("serve lock without --backend: %q, want it to say the flag is required", errOut)
	}
	// migrate said `unknown database ""` without --db.
	if _, _, errOut := runArgs(t, "migrate"); !strings.Contains(errOut, "--db is required: paydb, proxydb or lockdb") {
		t.Errorf("migrate without --db: %q, want it to say the flag is required and its values", errOut)
	}
	if code, _, errOut := runArgs(t, "migrate", "--db", "payments"); code != 2 || !strings.Contains(errOut, `--db must be paydb, proxydb or lockdb, got "payments"`) {
		t.Errorf("migrate --db payments: exit %d, %q, want 2 saying what --db must be", code, errOut)
	}
	t.Setenv("PAYOUTS_AMBIGUITY_SLA", "not-a-duration")
	code, _, errOut := runArgs(t, "reconcile", "--once")
	if code != 2 || !strings.Contains(errOut, "PAYOUTS_AMBIGUITY_SLA") {
		t.Errorf("reconcile with PAYOUTS_AMBIGUITY_SLA=not-a-duration: exit %d, want 2 naming the variable (%s)", code, errOut)
	}
}

// TestOutOfRangeFlagsAreUsageErrors: a zero or negative count or
// duration, or a value past a flag's documented range, is refused before
// anything runs, naming the flag (an executor took --call-timeout -1s and
// then waited for ever on a lock service that was up; reconcile clamped
// --page-size -3; dev up took --port-base -1 as "pick free ports").
func TestOutOfRangeFlagsAreUsageErrors(t *testing.T) {
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--concurrency", []string{"run", "executor", "--concurrency", "0"}},
		{"--concurrency", []string{"run", "executor", "--concurrency", "257"}},
		{"--call-timeout", []string{"run", "executor", "--call-timeout", "-1s"}},
		{"--session-ttl", []string{"run", "executor", "--session-ttl", "0s"}},
		{"--poll-interval", []string{"run", "executor", "--poll-interval", "0s"}},
		{"--page-size", []string{"reconcile", "--once", "--page-size", "-3"}},
		{"--page-size", []string{"reconcile", "--once", "--page-size", "1001"}},
		{"--bulk-page-size", []string{"reconcile", "--once", "--bulk-page-size", "20000"}},
		{"--max-findings", []string{"reconcile", "--once", "--max-findings", "0"}},
		{"--request-timeout", []string{"reconcile", "--once", "--request-timeout", "-1s"}},
		{"--port-base", []string{"dev", "up", "--port-base", "-1"}},
		{"--port-base", []string{"dev", "up", "--port-base", "65530"}},
		// A server's own settings are refused before it starts, as usage
		// errors; they exited 1, as if the server had failed, or were
		// replaced by a default without a word.
		{"--currency", []string{"serve", "payment", "--insecure-no-auth", "--currency", "eur"}},
		{"--currency", []string{"serve", "payment", "--insecure-no-auth", "--currency", ""}},
		{"--resolution-sla", []string{"serve", "payment", "--insecure-no-auth", "--resolution-sla", "0s"}},
		{"--ledger-check-interval", []string{"serve", "payment", "--insecure-no-auth", "--ledger-check-interval", "-1s"}},
		{"--max-db-conns", []string{"serve", "payment", "--insecure-no-auth", "--max-db-conns", "-1"}},
		{"--latency-ms", []string{"serve", "rail", "--latency-ms", "-5"}},
		{"--latency-ms", []string{"serve", "rail", "--latency-ms", "60001"}},
		{"--settlement-window", []string{"serve", "rail", "--settlement-window", "-1s"}},
		{"--grant-retention", []string{"serve", "lock", "--backend", "postgres", "--grant-retention", "-1h"}},
		{"--ambiguity-sla", []string{"reconcile", "--once", "--ambiguity-sla", "0s"}},
		{"--settlement-window", []string{"reconcile", "--once", "--settlement-window", "-1s"}},
		{"--lock-wait", []string{"reconcile", "--once", "--lock-wait", "-1s"}},
		{"--lock-wait", []string{"reconcile", "--once", "--lock-wait", "6m"}},
		{"--log-level", []string{"--log-level", "bogus", "serve", "payment", "--insecure-no-auth"}},
		{"--log-level", []string{"status", "--log-level", "verbose"}},
	} {
		code, _, errOut := runArgs(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.flag+" must be") {
			t.Errorf("payouts %s: exit %d (%q), want 2 saying what %s must be", strings.Join(c.args, " "), code, errOut, c.flag)
		}
	}
	// A fault rate is a usage error naming the rate.
	if code, _, errOut := runArgs(t, "serve", "rail", "--timeout-after-accept", "2"); code != 2 || !strings.Contains(errOut, "--timeout-after-accept must be a rate") {
		t.Errorf("serve rail --timeout-after-accept 2: exit %d (%q), want 2 naming the rate", code, errOut)
	}
	// A level in another case, and warning for warn, are levels.
	for _, level := range []string{"DEBUG", "warning", "Error"} {
		if code, _, errOut := runArgs(t, "--log-level", level, "version"); code != 0 {
			t.Errorf("--log-level %s version: exit %d (%q), want 0", level, code, errOut)
		}
	}
}

// TestCommandLineBeatsTheEnvironment: a flag given on the command line
// keeps out the variable of its pair's other flag, so PAYOUTS_TOKEN in
// the environment and --token-file on the line is not "mutually
// exclusive": the file's token is sent.
func TestCommandLineBeatsTheEnvironment(t *testing.T) {
	var got []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"items":[],"next":""}`)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("token-from-the-file-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PAYOUTS_TOKEN", "token-from-the-environment-0123")
	code, _, errOut := runArgs(t, "lock", "list", "--lock-url", srv.URL, "--token-file", file, "-o", "json")
	if code != 0 {
		t.Fatalf("lock list --token-file with PAYOUTS_TOKEN set: exit %d (%s)", code, errOut)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 || got[0] != "Bearer token-from-the-file-0123456789" {
		t.Fatalf("sent %q, want the file's token", got)
	}
}

// TestStatusReadsTheLockServiceHighTokenAfterTheFences: under load, a
// token granted between status reading the lock service's high token and
// a guard's fence made the fence look higher than the lock service's
// tokens: "lock service rewound", exit 1 and a bump-tokens advice. The
// high token is read after both guards' fences.
func TestStatusReadsTheLockServiceHighTokenAfterTheFences(t *testing.T) {
	var (
		mu    sync.Mutex
		order []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/tokens/high" || r.URL.Path == "/v1/fences/high" {
			mu.Lock()
			order = append(order, r.Host+r.URL.Path)
			mu.Unlock()
		}
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			return // 200: every role up, so status asks each for its numbers
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer srv.Close()
	lock, guard := srv.Listener.Addr().String(), strings.Replace(srv.Listener.Addr().String(), "127.0.0.1", "localhost", 1)
	code, out, _ := runArgs(t, "status", "-o", "json", "--token", "status-test-token-0123456789", "--lock-url", "http://"+lock, "--payment-url", "http://"+guard,
		"--proxy-url", "http://"+guard, "--rail-url", "", "--timeout", "30s")
	// Every count failed (404): the payment resource's ambiguous count is
	// unknown, not a reassuring zero.
	if code != 1 || strings.Contains(out, `"ambiguous"`) || strings.Contains(out, `"RAIL_AMBIGUOUS"`) {
		t.Errorf("status with every payout count failing: exit %d, output %s; want exit 1 and no ambiguous count", code, out)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{guard + "/v1/fences/high", guard + "/v1/fences/high", lock + "/v1/tokens/high"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("status read %v, want the lock service's high token last: %v", order, want)
	}
}

// TestCommandLoggerIsSlogDefault: a library falling back to slog.Default()
// (the reconciler's lock client did) writes the command's JSON lines with
// the role, not plain text mixed into them.
func TestCommandLoggerIsSlogDefault(t *testing.T) {
	prev := slog.Default()
	defer slog.SetDefault(prev)
	var buf bytes.Buffer
	c := &cobra.Command{}
	c.SetErr(&buf)
	newApp().logger(c, "reconciler")
	slog.Default().Warn("lock session in jeopardy", "session_id", "s-1")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line["role"] != "reconciler" || line["session_id"] != "s-1" {
		t.Fatalf("slog.Default() wrote %q (%v), want the command's JSON line with role=reconciler", buf.String(), err)
	}
}

// A table cell shows stored text (a cancel reason, a rail's reference) with
// its control and format characters escaped: a line break or tab would
// break the table, an escape sequence rewrite the operator's terminal, a
// right-to-left override make one text read as another.
func TestTableCellsShowControlCharactersEscaped(t *testing.T) {
	var b strings.Builder
	if err := newTable("A", "B").row("x\x1b[2Jy", "line one\nline\ttwo\r").row("acct \u202e9876", "Zoë, plain").write(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{`x\x1b[2Jy`, `line one\nline\ttwo\r`, `acct \u202e9876`, "Zoë, plain"} {
		if !strings.Contains(got, want) {
			t.Errorf("table %q does not show %q", got, want)
		}
	}
	if strings.ContainsAny(got, "\x1b\r\u202e") || strings.Count(got, "\n") != 3 {
		t.Errorf("table %q kept a control or format character", got)
	}
}

// TestDevUpChecksItsFlagsFirst: `dev up --settlement-window -1s` started
// PostgreSQL and etcd and was refused only when the rail stub it was
// passed to exited. A value a role would refuse is a usage error before
// anything is started: nothing is created in --dir.
func TestDevUpChecksItsFlagsFirst(t *testing.T) {
	for _, window := range []string{"-1s", "0s"} {
		dir := t.TempDir()
		code, _, errOut := runCtx(t, testCtx(t), "dev", "up", "--dir", dir, "--port-base", "0", "--settlement-window", window)
		entries, _ := os.ReadDir(dir)
		if code != 2 || !strings.Contains(errOut, "--settlement-window must be") || len(entries) != 0 {
			t.Errorf("dev up --settlement-window %s: exit %d, %q, %d entries in --dir; want exit 2 saying what --settlement-window must be, nothing started", window, code, errOut, len(entries))
		}
	}
}

// TestDevUpRefusesADirWhoseStackRuns: a second `dev up --dir D` while D's
// stack ran said "PostgreSQL did not start: ... Examine the log output".
// It is a usage error saying that a stack runs in D, with its pids.
func TestDevUpRefusesADirWhoseStackRuns(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "pg", "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		t.Fatal(err)
	}
	// This process stands in for D's PostgreSQL, its parent for D's dev up.
	pg, dev := os.Getpid(), os.Getppid()
	_ = writeFileAt(t, filepath.Join(data, "postmaster.pid"), strconv.Itoa(pg)+"\n"+data+"\n")
	_ = writeFileAt(t, filepath.Join(dir, "run", "dev.pid"), strconv.Itoa(dev)+"\n")
	code, _, errOut := runCtx(t, testCtx(t), "dev", "up", "--dir", dir, "--port-base", "0")
	want := fmt.Sprintf("a stack already runs in %s (dev up pid %d, PostgreSQL pid %d)", dir, dev, pg)
	if code != 2 || !strings.Contains(errOut, want) {
		t.Fatalf("dev up --dir D while D's stack runs: exit %d, %q; want exit 2 and %q", code, errOut, want)
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err == nil {
		t.Fatal("dev up initialised a cluster in a running stack's directory")
	}
}

func writeFileAt(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBenchReconcileCountsCheckedFirst: `bench reconcile --per-grant 0`
// ran with 50 payouts per grant without a word. A count below 1 is a
// usage error naming the flag, before a stack is started (--dir, a plain
// file here, is never used).
func TestBenchReconcileCountsCheckedFirst(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"--per-grant", "0"}, {"--per-grant", "-3"}, {"--payouts", "0"}} {
		args := append([]string{"bench", "reconcile", "--dir", notADir}, c...)
		code, _, errOut := runCtx(t, testCtx(t), args...)
		if code != 2 || !strings.Contains(errOut, c[0]+" must be at least 1") {
			t.Errorf("payouts %s: exit %d, %q; want exit 2 saying what %s must be", strings.Join(args, " "), code, errOut, c[0])
		}
	}
}

// TestFlagHelpNamesNoQuotedText: pflag takes the first `quoted` text of a
// flag's usage as the name of its value, so `bench reconcile --help` read
// "--reconcile-arg payouts reconcile". A value's name is one word.
func TestFlagHelpNamesNoQuotedText(t *testing.T) {
	walk(NewRoot(), func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
				t.Errorf("%s --help shows --%s %s: quoted text of its usage taken for the value's name", c.CommandPath(), f.Name, name)
			}
		})
	})
}
