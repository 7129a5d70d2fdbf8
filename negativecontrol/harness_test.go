// Package negativecontrol holds the negative controls of DESIGN §5: for each
// invariant INV-01..08 (bar INV-06, see docs/architecture.md) one scenario
// run against the real system — PostgreSQL, the servers as child processes —
// that tries to break the invariant. Built with the negativecontrol tag, the
// invariant's primary enforcement is gone (compiled out of the servers, or
// removed from the test's own database, or bypassed by the test) and the
// test shows the violation land and the named detective control fire.
// Built without it, the same scenario must land nothing.
//
//	go test -race -count=1 ./negativecontrol/                         (primaries in place)
//	go test -race -count=1 -tags negativecontrol ./negativecontrol/   (primaries removed)
package negativecontrol

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

func TestMain(m *testing.M) {
	// The payment resource's continuous ledger check (INV-03's drift gauge)
	// runs every second in the stack's child processes.
	os.Setenv("PAYOUTS_LEDGER_CHECK_INTERVAL", "1s")
	proctest.Main(m, nil)
}

// sys is one running stack: the devstack roles plus a lock service on the
// PostgreSQL backend (lockdb), which every scenario takes its grants from
// and the reconciler reads, so INV-04's token sequence can be rewound.
type sys struct {
	st      *stack.Stack
	lockURL string
	pay     *pc.Client
	proxy   *proxyclient.Client
	rail    *railclient.Client
	lockAdm *lockclient.Client
	a, b    *lockclient.Session // two holders
}

var seq atomic.Int64

func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, seq.Add(1))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startSys(t *testing.T) *sys {
	t.Helper()
	bin := proctest.Binary(t)
	dir, err := os.MkdirTemp("", "negativecontrol-stack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st, err := stack.Start(ctx, stack.Options{Dir: dir, Binary: bin, SettlementWindow: time.Second, RailTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { _ = st.Stop() })
	r := st.Ready
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &sys{st: st, lockURL: "http://127.0.0.1:" + strconv.Itoa(port)}
	proctest.Start(t, "lock-postgres", nil, "serve", "lock", "--backend", "postgres", "--listen", "127.0.0.1:"+strconv.Itoa(port),
		"--database-url", r.DatabaseURLs.LockDB, "--auth-file", filepath.Join(r.Dir, "auth.json"))
	waitUntil(t, time.Minute, "the PostgreSQL-backed lock service is ready", func() (bool, error) {
		resp, err := http.Get(s.lockURL + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	op := r.Tokens.Operator
	if s.pay, err = pc.New(r.PaymentURL, op); err != nil {
		t.Fatal(err)
	}
	// Only an executor submits to the proxy.
	if s.proxy, err = proxyclient.New(r.ProxyURL, r.Tokens.Executor); err != nil {
		t.Fatal(err)
	}
	if s.rail, err = railclient.New(r.RailURL, op); err != nil {
		t.Fatal(err)
	}
	if s.lockAdm, err = lockclient.New(s.lockURL, lockclient.WithToken(op)); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		dst   **lockclient.Session
		owner string
	}{{&s.a, "holder-a"}, {&s.b, "holder-b"}} {
		sess, err := lockclient.Open(ctx, s.lockURL, h.owner, lockclient.WithToken(op), lockclient.WithTTL(60*time.Second))
		if err != nil {
			t.Fatalf("lock session %s: %v", h.owner, err)
		}
		*h.dst = sess
		// Closed before the stack stops (cleanups run last-in first-out), so
		// no keepalive outlives the test.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = sess.Close(ctx) // stops the keepalive loop whatever the service answers
		})
	}
	return s
}

// waitUntil polls cond with a generous deadline (never a sleep as
// synchronisation).
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *sys) account(t *testing.T, balance int64) string {
	t.Helper()
	id := uniq("acc")
	if _, err := s.pay.CreateAccount(ctxT(t), pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: balance}); err != nil {
		t.Fatalf("create account: %v", err)
	}
	return id
}

func (s *sys) payout(t *testing.T, account string, amount int64) pc.Payout {
	t.Helper()
	p, err := s.pay.CreatePayout(ctxT(t), pc.CreatePayoutRequest{ID: uniq("po"), AccountID: account, Amount: amount, Currency: "EUR", BeneficiaryRef: "BEN-" + account})
	if err != nil {
		t.Fatalf("create payout: %v", err)
	}
	return p
}

func (s *sys) grant(t *testing.T, sess *lockclient.Session, account string) *lockclient.Grant {
	t.Helper()
	g, err := sess.Acquire(ctxT(t), fencing.Key(account), 30*time.Second)
	if err != nil {
		t.Fatalf("acquire %s: %v", fencing.Key(account), err)
	}
	return g
}

func (s *sys) release(t *testing.T, sess *lockclient.Session, g *lockclient.Grant) {
	t.Helper()
	if err := sess.Release(ctxT(t), g); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func submission(p pc.Payout) proxyclient.Submission {
	return proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}
}

// payOut drives p from PENDING to POSTED under (token, holder).
func (s *sys) payOut(t *testing.T, p pc.Payout, token fencing.Token, holder fencing.Holder) {
	t.Helper()
	ctx := ctxT(t)
	must := func(_ pc.Payout, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("pay %s: %v", p.ID, err)
		}
	}
	must(s.pay.Claim(ctx, p.ID, token, holder))
	must(s.pay.Submitting(ctx, p.ID, token, holder))
	rec, err := s.proxy.Submit(ctx, submission(p), token, holder)
	if err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("proxy submit %s: %+v %v", p.ID, rec, err)
	}
	must(s.pay.ReportOutcome(ctx, p.ID, token, holder, pc.OutcomeAcked, rec.RailRef, ""))
	must(s.pay.Post(ctx, p.ID, token, holder))
}

// exec runs SQL on one of the stack's databases (replica: triggers off,
// the way a planted row would get past them).
func (s *sys) exec(t *testing.T, db string, replica bool, sql string, args ...any) error {
	t.Helper()
	urls := s.st.Ready.DatabaseURLs
	url := map[string]string{"paydb": urls.PayDB, "proxydb": urls.ProxyDB, "lockdb": urls.LockDB}[db]
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", db, err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // no-op after commit
	if replica {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (s *sys) railPayments(t *testing.T, clientRef string) []railclient.Payment {
	t.Helper()
	all, err := s.rail.SettlementReport(ctxT(t))
	if err != nil {
		t.Fatalf("rail settlement report: %v", err)
	}
	var out []railclient.Payment
	for _, p := range all {
		if p.ClientRef == clientRef {
			out = append(out, p)
		}
	}
	return out
}

func (s *sys) events(t *testing.T, payoutID string) []pc.PayoutEvent {
	t.Helper()
	l, err := s.pay.PayoutEvents(ctxT(t), payoutID, 0, 1000)
	if err != nil {
		t.Fatalf("payout events %s: %v", payoutID, err)
	}
	return l.Items
}

func (s *sys) get(t *testing.T, id string) pc.Payout {
	t.Helper()
	p, err := s.pay.Payout(ctxT(t), id)
	if err != nil {
		t.Fatalf("payout %s: %v", id, err)
	}
	return p
}

// metric reads one sample (exact name with labels) from a server's /metrics.
func metric(t *testing.T, baseURL, sample string) float64 {
	t.Helper()
	return proctest.Metric(t, baseURL+"/metrics", sample)
}

// finding is one member of `payouts reconcile --json`'s findings.
type finding struct {
	Invariant string         `json:"invariant"`
	Check     string         `json:"check"`
	Objects   map[string]any `json:"objects"`
	Evidence  string         `json:"evidence"`
}

type report struct {
	Findings      []finding `json:"findings"`
	HighestFence  int64     `json:"highest_fence"`
	LockHighToken int64     `json:"lock_high_token"`
}

// run runs the payouts binary with the reconciler's token.
func (s *sys) run(t *testing.T, token string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctxT(t), proctest.Binary(t), args...)
	cmd.Env = append(os.Environ(), "PAYOUTS_TOKEN="+token)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run payouts %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// reconcile runs `payouts reconcile --once --json` against the stack (the
// lock service on PostgreSQL), given a reconciler-role rail credential
// explicitly (lookups by client reference; the settlement report is the
// operator's). Exit 2 (could not run) fails the test.
func (s *sys) reconcile(t *testing.T) report {
	t.Helper()
	r := s.st.Ready
	stdout, stderr, code := s.run(t, r.Tokens.Reconciler, "reconcile", "--once", "--json", "--lock-url", s.lockURL,
		"--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL, "--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["reconciler"])
	if code != 0 && code != 1 {
		t.Fatalf("reconcile exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("reconcile --json: %v\n%s\n%s", err, stdout, stderr)
	}
	if (code == 0) != (len(rep.Findings) == 0) {
		t.Fatalf("reconcile exit %d with %d findings", code, len(rep.Findings))
	}
	return rep
}

func (r report) find(check string, want map[string]any) []finding {
	var out []finding
	for _, f := range r.Findings {
		if f.Check != check {
			continue
		}
		ok := true
		for k, v := range want {
			if fmt.Sprint(f.Objects[k]) != fmt.Sprint(v) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, f)
		}
	}
	return out
}

// fired fails unless the report has a finding of check about want, naming
// invariant.
func fired(t *testing.T, rep report, invariant, check string, want map[string]any) {
	t.Helper()
	got := rep.find(check, want)
	if len(got) == 0 {
		b, _ := json.MarshalIndent(rep.Findings, "", "  ")
		t.Fatalf("detective %s did not fire about %v; findings:\n%s", check, want, b)
	}
	if got[0].Invariant != invariant || got[0].Evidence == "" {
		t.Fatalf("%s finding names %q (want %s), evidence %q", check, got[0].Invariant, invariant, got[0].Evidence)
	}
}

// silent fails if the report has a finding of check about want.
func silent(t *testing.T, rep report, check string, want map[string]any) {
	t.Helper()
	if got := rep.find(check, want); len(got) > 0 {
		t.Fatalf("unexpected %s finding about %v: %+v", check, want, got)
	}
}
