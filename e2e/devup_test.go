package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/internal/httpx"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// devUp runs `payouts dev up --json` on the bundle's directory and returns
// the command and its ready line.
func (b *devBundle) devUp(env []string, portBase int, extra ...string) (*command, stack.Ready) {
	b.t.Helper()
	c := b.start(env, append([]string{"dev", "up", "--dir", b.dir, "--json", "--port-base", strconv.Itoa(portBase)}, extra...)...)
	line := c.waitLine(b.t, 4*time.Minute, `{"lock_url"`)
	var ready stack.Ready
	if err := json.Unmarshal([]byte(line), &ready); err != nil {
		b.t.Fatalf("ready line is not JSON: %v\n%s", err, line)
	}
	var raw map[string]any
	_ = json.Unmarshal([]byte(line), &raw)
	for _, k := range []string{"lock_url", "payment_url", "proxy_url", "rail_url", "tokens", "database_urls", "pids", "token_files"} {
		if _, ok := raw[k]; !ok {
			b.t.Fatalf("ready line lacks %q: %s", k, line)
		}
	}
	if !b.dumpLogs {
		// One dump of the logs (later runs append to the same files).
		b.dumpLogs = true
		b.t.Cleanup(func() {
			if b.t.Failed() {
				for role, path := range ready.Logs {
					data, _ := os.ReadFile(path)
					b.t.Logf("--- %s log ---\n%s", role, tailLines(string(data), 20))
				}
			}
		})
	}
	return c, ready
}

// stopClean sends sig to a running command and checks it stops as a clean
// stop must: exit 0, nothing on the console that reads as a failure.
func stopClean(t *testing.T, c *command, sig syscall.Signal, what string) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if code := c.wait(t, 2*time.Minute); code != 0 {
		t.Errorf("%s exited %d after %s, want 0; output:\n%s", what, code, sig, tailLines(c.output(), 40))
	}
	checkCleanConsole(t, what, c.output())
}

// checkLogClean fails if a log file holds a line at level error.
func checkLogClean(t *testing.T, name, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%s log: %v", name, err)
		return
	}
	if bad := consoleTrouble(string(b)); len(bad) > 0 {
		t.Errorf("%s log (%s) holds errors after a clean stop:\n%s", name, path, strings.Join(bad, "\n"))
	}
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

// TestDevUpReadyStopRestart: dev up comes up with every role answering,
// stops on Ctrl-C (SIGINT) with exit 0, a clean console and no error in any
// role's log or etcd's, leaves nothing running, and a second run on the
// same directory reuses its data, tokens and the rail's payments, and stops
// on SIGTERM alike.
func TestDevUpReadyStopRestart(t *testing.T) {
	b := setup(t)
	c, ready := b.devUp(nil, 0)
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
	// A payment the rail made in this run (the rail proxy's credential).
	railPx, err := railclient.New(ready.RailURL, ready.Tokens.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	paid, err := railPx.Pay(context.Background(), railclient.PaymentRequest{ClientRef: "devup-kept-1", Amount: 100, Currency: "EUR", BeneficiaryRef: "ben-1"})
	if err != nil {
		t.Fatalf("pay at the dev stack's rail: %v", err)
	}
	// The stack's tables start empty and grow: autovacuum looks often, so
	// the planner's statistics (and the plans of prepared statements)
	// follow them instead of keeping sequential scans made for empty tables.
	conn, err := pgx.Connect(context.Background(), ready.DatabaseURLs.PayDB)
	if err != nil {
		t.Fatal(err)
	}
	var naptime string
	err = conn.QueryRow(context.Background(), "SHOW autovacuum_naptime").Scan(&naptime)
	conn.Close(context.Background())
	if err != nil || naptime != "5s" {
		t.Fatalf("the stack's autovacuum_naptime is %q (%v), want 5s", naptime, err)
	}
	for _, role := range []string{"lock", "payment", "proxy", "rail", "postgres"} {
		if ready.PIDs[role] == 0 {
			t.Fatalf("ready line has no pid for %s: %v", role, ready.PIDs)
		}
	}
	etcdLog := filepath.Join(b.dir, "logs", "etcd.log")
	if ready.Logs["etcd"] != etcdLog {
		t.Fatalf("etcd's log is %q, want %s", ready.Logs["etcd"], etcdLog)
	}

	stopClean(t, c, syscall.SIGINT, "dev up")
	for role, path := range ready.Logs {
		if role != "postgres" {
			checkLogClean(t, role, path)
		}
	}
	if data, _ := os.ReadFile(etcdLog); !strings.Contains(string(data), `"level":"info"`) {
		t.Errorf("etcd.log has no info line although dev up ran at level info:\n%s", tailLines(string(data), 10))
	}
	waitGone(t, ready.PIDs, "dev up")

	// A second run on the same directory reuses its data and tokens.
	c2, ready2 := b.devUp(nil, 0)
	if ready2.Tokens != ready.Tokens {
		t.Error("second run generated new tokens instead of reusing DIR/auth.json")
	}
	// The rail still knows what it paid, as the databases still hold the
	// payouts it was paid for: otherwise every payout posted in an earlier
	// run reads as posted but never settled.
	railPx2, err := railclient.New(ready2.RailURL, ready2.Tokens.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	look, err := railPx2.Find(context.Background(), "devup-kept-1")
	if err != nil || len(look.Items) != 1 || look.Items[0].RailRef != paid.RailRef || look.Items[0].Amount != 100 {
		t.Errorf("the second run's rail does not have the first run's payment %s: %+v %v", paid.RailRef, look, err)
	}
	stopClean(t, c2, syscall.SIGTERM, "dev up (second run)")
	waitGone(t, ready2.PIDs, "dev up (second run)")

	// A third run, from a shell that exported variables for its own
	// commands (which the roles would otherwise inherit: the etcd lock
	// service refuses a database URL), stopped by a closed terminal
	// (SIGHUP): PostgreSQL goes too.
	c3, ready3 := b.devUp([]string{"PAYOUTS_DATABASE_URL=postgres://someone@127.0.0.1:1/paydb", "PAYOUTS_LISTEN=127.0.0.1:1",
		"PAYOUTS_MIGRATE=not-a-bool"}, 0)
	stopClean(t, c3, syscall.SIGHUP, "dev up (third run)")
	waitGone(t, ready3.PIDs, "dev up (third run)")
}

// waitGone fails unless every process of pids (a ready line's) has exited
// within 30 s of a stop.
func waitGone(t *testing.T, pids map[string]int, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for role, pid := range pids {
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if alive(pid) {
			t.Fatalf("%s (pid %d) still running after %s stopped", role, pid, what)
		}
	}
}

func TestDevUpPortTakenIsAClearError(t *testing.T) {
	b := setup(t)
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	base := port - 1 // the lock service's port (+1) is the taken one
	l, err := listenTCP(port)
	if err != nil {
		t.Fatalf("could not hold port %d: %v", port, err)
	}
	defer l.Close()
	c := b.start(nil, "dev", "up", "--dir", b.dir, "--json", "--port-base", strconv.Itoa(base))
	if code := c.wait(t, 2*time.Minute); code == 0 {
		t.Fatalf("dev up started on a taken port:\n%s", c.output())
	}
	if !strings.Contains(c.output(), "already in use") {
		t.Fatalf("error does not say the port is in use:\n%s", c.output())
	}
	checkCleanConsole(t, "dev up on a taken port", c.output())
}

// TestDevUpRoleFailingToStartIsOneLine: a role that cannot start is named
// on one console line with the log file to read; no stack trace, and
// nothing is left running.
func TestDevUpRoleFailingToStartIsOneLine(t *testing.T) {
	b := setup(t)
	// An auth file others can read, reused from an earlier run: the lock
	// service, the first role started, refuses it.
	if err := os.MkdirAll(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(b.dir, "auth.json")
	var tokens []string
	for _, role := range []string{"executor", "reconciler", "operator", "proxy"} {
		tokens = append(tokens, fmt.Sprintf(`{"token":"%s-token-0123456789abcdef","role":"%s","name":"dev-%s"}`, role, role, role))
	}
	if err := os.WriteFile(authFile, []byte(`{"tokens":[`+strings.Join(tokens, ",")+`]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(authFile, 0o644); err != nil {
		t.Fatal(err)
	}
	c := b.start(nil, "dev", "up", "--dir", b.dir, "--json", "--port-base", "0")
	if code := c.wait(t, 4*time.Minute); code == 0 {
		t.Fatalf("dev up succeeded with a role that cannot start:\n%s", c.output())
	}
	out := c.output()
	var failure []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, " exited ") {
			failure = append(failure, line)
		}
	}
	if len(failure) != 1 || !strings.Contains(failure[0], "see "+filepath.Join(b.dir, "logs")) {
		t.Fatalf("want one line naming the role that exited and its log, got:\n%s", out)
	}
	checkCleanConsole(t, "dev up with a failing role", out)
	_, logPath, _ := strings.Cut(failure[0], "see ")
	if data, _ := os.ReadFile(strings.TrimSpace(logPath)); !strings.Contains(string(data), "chmod 600") {
		t.Fatalf("the failing role's log (%s) does not say what it refused:\n%s", logPath, data)
	}
}

// TestServeLockEmbeddedEtcdStopsClean: `serve lock --etcd-embed-dir` writes
// etcd's log beside its data at the level the lock service was started
// with, and a SIGTERM stops both with exit 0, a clean console and no error
// in that log.
func TestServeLockEmbeddedEtcdStopsClean(t *testing.T) {
	b := setup(t)
	embed := filepath.Join(b.dir, "etcd")
	etcdLog := filepath.Join(embed, "etcd.log")
	run := func(level string) {
		t.Helper()
		port, err := infra.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		url := "http://127.0.0.1:" + strconv.Itoa(port)
		c := b.start(nil, "serve", "lock", "--backend", "etcd", "--etcd-embed-dir", embed, "--insecure-no-auth",
			"--listen", "127.0.0.1:"+strconv.Itoa(port), "--log-level", level)
		waitUntil(t, 2*time.Minute, "the lock service to be ready", func() (bool, error) {
			resp, err := http.Get(url + "/readyz")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == 200, nil
		})
		stopClean(t, c, syscall.SIGTERM, "serve lock --etcd-embed-dir (log level "+level+")")
		checkLogClean(t, "etcd", etcdLog)
	}
	run("info")
	data, err := os.ReadFile(etcdLog)
	if err != nil || !strings.Contains(string(data), `"level":"info"`) {
		t.Fatalf("etcd.log beside the data has no info line at level info: %v\n%s", err, data)
	}
	run("warn")
	after, _ := os.ReadFile(etcdLog)
	if strings.Contains(string(after[len(data):]), `"level":"info"`) {
		t.Errorf("etcd wrote info lines although the lock service ran at level warn:\n%s", after[len(data):])
	}
}

func listenTCP(port int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
}

// TestDevUpTLSOneTokenPerRoleNoSecretOnACommandLine: `dev up --tls` runs
// every role over HTTPS with a throwaway CA, issues one token per role
// (the proxy its own, for the rail), hands every secret to its children in
// 0600 files rather than on their command lines, and a payout goes all the
// way to the rail through it (the proxy calling the rail over TLS with its
// own token).
func TestDevUpTLSOneTokenPerRoleNoSecretOnACommandLine(t *testing.T) {
	b := setup(t)
	c, ready := b.devUp(nil, 0, "--tls")
	if ready.TLS == nil {
		t.Fatal("the ready line of dev up --tls has no tls files")
	}
	tok := ready.Tokens
	seen := map[string]bool{}
	for role, v := range map[string]string{"executor": tok.Executor, "reconciler": tok.Reconciler, "operator": tok.Operator, "proxy": tok.Proxy} {
		if v == "" || seen[v] {
			t.Fatalf("token of %s is empty or shared: %+v", role, tok)
		}
		seen[v] = true
		st, err := os.Stat(ready.TokenFiles[role])
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("token file of %s: %v %v, want mode 0600", role, err, st)
		}
		if data, _ := os.ReadFile(ready.TokenFiles[role]); strings.TrimSpace(string(data)) != v {
			t.Fatalf("token file of %s does not hold its token", role)
		}
	}
	// No child carries a secret on its command line (what ps shows).
	for name, pid := range ready.PIDs {
		cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			t.Fatalf("%s (pid %d): %v", name, pid, err)
		}
		for secret := range seen {
			if strings.Contains(string(cmdline), secret) {
				t.Errorf("%s has a token on its command line: %q", name, cmdline)
			}
		}
		if strings.Contains(string(cmdline), "postgres://") {
			t.Errorf("%s has a database URL on its command line: %q", name, cmdline)
		}
	}
	hc, err := ready.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{ready.LockURL, ready.PaymentURL, ready.ProxyURL, ready.RailURL} {
		if !strings.HasPrefix(u, "https://127.0.0.1:") {
			t.Fatalf("URL %s is not https", u)
		}
		resp, err := hc.Get(u + "/readyz")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s/readyz over TLS: %v", u, err)
		}
		resp.Body.Close()
		// The same port refuses plain HTTP.
		if resp, err := http.Get("http://" + strings.TrimPrefix(u, "https://") + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Fatalf("%s answers plain HTTP", u)
			}
		}
	}

	pay, err := pc.New(ready.PaymentURL, tok.Operator, httpx.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 3*time.Minute)
	if _, err := pay.CreateAccount(ctx, pc.CreateAccountRequest{ID: "tls-acc", Currency: "EUR", OpeningBalance: 10_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := pay.CreatePayout(ctx, pc.CreatePayoutRequest{ID: "tls-po", AccountID: "tls-acc", Amount: 500, Currency: "EUR", BeneficiaryRef: "BEN-TLS"}); err != nil {
		t.Fatal(err)
	}
	ex := b.start([]string{"PAYOUTS_TOKEN_FILE=" + ready.TokenFiles["executor"]}, "run", "executor", "--owner", "tls-executor",
		"--lock-url", ready.LockURL, "--payment-url", ready.PaymentURL, "--proxy-url", ready.ProxyURL,
		"--ca-file", ready.TLS.CA, "--poll-interval", "200ms")
	waitUntil(t, 2*time.Minute, "the payout to be POSTED over TLS", func() (bool, error) {
		p, err := pay.Payout(ctx, "tls-po")
		if err != nil {
			return false, err
		}
		if p.State != pc.Posted {
			return false, fmt.Errorf("payout is %s", p.State)
		}
		return true, nil
	})
	stopClean(t, ex, syscall.SIGTERM, "run executor")
	stopClean(t, c, syscall.SIGINT, "dev up --tls")
}
