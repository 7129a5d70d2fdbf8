package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/executor"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// The executor's crash and hold hooks, and the proxy's crash points, are
// compiled only into binaries built with -tags crashpoints. The hooks do
// nothing unless their environment variables are set, so every e2e test
// can share that binary.
func init() {
	tags := os.Getenv("PAYOUTS_TEST_BUILD_TAGS")
	for _, tag := range strings.FieldsFunc(tags, func(r rune) bool { return r == ',' || r == ' ' }) {
		if tag == "crashpoints" {
			return
		}
	}
	if tags != "" {
		tags += ","
	}
	os.Setenv("PAYOUTS_TEST_BUILD_TAGS", tags+"crashpoints")
}

// executorTTL is short so takeovers happen quickly; the lock service and
// etcd round it to whole seconds.
const executorTTL = "3s"

// steadyExecutorTTL is for tests that require no executor to lose its
// session (they assert that nobody was fenced out): long enough that a
// stall of a loaded machine does not lapse a session and cause a correct,
// but unwanted, takeover.
const steadyExecutorTTL = "15s"

// steadyRailTimeout is the proxy's rail timeout for tests that need every
// payout POSTED and run no reconciler: one slow rail call on a loaded
// machine must not time out and leave a payout RAIL_AMBIGUOUS for good. It
// stays below the executor's proxy call timeout (proxyclient.DefaultTimeout).
const steadyRailTimeout = 30 * time.Second

// startExecutor runs `payouts run executor` against the system.
func (s *system) startExecutor(t *testing.T, name string, env []string, extra ...string) *proctest.Proc {
	t.Helper()
	return s.startExecutorTTL(t, name, executorTTL, env, extra...)
}

// startSteadyExecutor runs an executor with steadyExecutorTTL.
func (s *system) startSteadyExecutor(t *testing.T, name string, env []string, extra ...string) *proctest.Proc {
	t.Helper()
	return s.startExecutorTTL(t, name, steadyExecutorTTL, env, extra...)
}

// startExecutorTTL runs `payouts run executor` with the given session TTL.
func (s *system) startExecutorTTL(t *testing.T, name, ttl string, env []string, extra ...string) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	args := []string{"run", "executor", "--owner", name, "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
		"--proxy-url", r.ProxyURL, "--session-ttl", ttl, "--poll-interval", "200ms"}
	env = append(env, "PAYOUTS_TOKEN="+r.Tokens.Executor)
	return proctest.Start(t, name, env, append(args, extra...)...)
}

// stopExecutor sends SIGTERM and requires a clean exit 0.
func stopExecutor(t *testing.T, p *proctest.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.Name, err)
	}
	code, err := p.Wait(2 * time.Minute)
	if err != nil || code != 0 {
		t.Fatalf("%s after SIGTERM: exit %d, %v\n%s", p.Name, code, err, tailLines(p.Log(), 30))
	}
	if !strings.Contains(p.Log(), "lock session closed") {
		t.Fatalf("%s exited without closing its lock session:\n%s", p.Name, tailLines(p.Log(), 30))
	}
}

var settledStates = []pc.State{pc.Posted, pc.Failed, pc.RailAmbiguous}

// checkMoney asserts the whole-system money properties over payouts: no
// client reference paid twice at the rail; every POSTED payout settled
// exactly once at the rail for its amount; no FAILED payout settled; the
// ledger debited each account exactly its POSTED payouts.
func (s *system) checkMoney(t *testing.T, payouts []pc.Payout, opening map[string]int64) {
	t.Helper()
	rail := s.railPayments(t)
	for ref, items := range rail {
		if len(items) > 1 {
			t.Errorf("client reference %s was paid %d times at the rail: %+v", ref, len(items), items)
		}
	}
	var posted, settled int64
	debits := map[string]int64{}
	for _, p := range payouts {
		items := rail[p.ClientRef]
		settledHere := 0
		for _, it := range items {
			if it.Status == railclient.StatusSettled {
				settledHere++
				if p.State == pc.Posted {
					settled += it.Amount
				}
			}
		}
		switch p.State {
		case pc.Posted:
			posted += p.Amount
			debits[p.AccountID] += p.Amount
			if settledHere != 1 {
				t.Errorf("payout %s is POSTED but the rail settled it %d times", p.ID, settledHere)
			}
		case pc.Failed:
			if settledHere != 0 {
				t.Errorf("payout %s is FAILED (%s) but the rail settled it", p.ID, p.FailureReason)
			}
		}
	}
	if posted != settled {
		t.Errorf("money POSTED %d != money settled at the rail for those payouts %d", posted, settled)
	}
	for acc, open := range opening {
		a, err := s.pay.Account(ctxT(t, 30*time.Second), acc)
		if err != nil {
			t.Fatalf("account %s: %v", acc, err)
		}
		if a.Balance != open-debits[acc] {
			t.Errorf("account %s balance %d, want opening %d - posted %d", acc, a.Balance, open, debits[acc])
		}
	}
}

func countStates(ps []pc.Payout) map[pc.State]int {
	m := map[pc.State]int{}
	for _, p := range ps {
		m[p.State]++
	}
	return m
}

// TestExecutorsDrainUnderRailFaults: 3 executors x 300 payouts over 50
// accounts with the rail timing out after accepting, failing before
// accepting and declining. One executor is stopped with SIGTERM mid-run.
func TestExecutorsDrainUnderRailFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSystem(t, stack.Options{SettlementWindow: 2 * time.Second, RailTimeout: time.Second})
	const accounts, payouts = 50, 300
	opening := map[string]int64{}
	for i := 0; i < accounts; i++ {
		id := fmt.Sprintf("acc-%02d", i)
		bal := int64(1_000_000)
		if i%10 == 9 {
			bal = 2_500 // too little for all its payouts: some fail on funds
		}
		opening[id] = bal
		s.createAccount(t, id, bal)
	}
	for i := 0; i < payouts; i++ {
		ben := fmt.Sprintf("BEN-%03d", i)
		if i%23 == 0 {
			ben = "DECLINE-" + ben
		}
		s.createPayout(t, fmt.Sprintf("po-%03d", i), fmt.Sprintf("acc-%02d", i%accounts), 1000+int64(i), ben)
	}
	f := railclient.Faults{TimeoutAfterAccept: 0.04, ErrorBeforeAccept: 0.05, ErrorAfterAccept: 0.02,
		DropBeforeAccept: 0.02, LatencyMS: 2, DeclineBeneficiaryPrefix: "DECLINE"}
	if _, err := s.rail.SetFaults(ctxT(t, 30*time.Second), f.Full()); err != nil {
		t.Fatal(err)
	}
	var execs []*proctest.Proc
	for i := 1; i <= 3; i++ {
		// A steady TTL: the check below that nobody was fenced out must
		// not be failed by a stall that lapses a session.
		execs = append(execs, s.startSteadyExecutor(t, fmt.Sprintf("exec-%d", i), nil, "--concurrency", "4"))
	}
	// Stop one executor gracefully while the others are busy.
	waitUntil(t, 3*time.Minute, "a third of the payouts to settle", func() (bool, error) {
		c := countStates(s.payouts(t, ""))
		return c[pc.Posted]+c[pc.Failed]+c[pc.RailAmbiguous] >= payouts/3, nil
	})
	stopExecutor(t, execs[2])

	waitUntil(t, 4*time.Minute, "every payout to leave the actionable states", func() (bool, error) {
		for _, p := range s.payouts(t, "") {
			if p.State.Actionable() {
				return false, fmt.Errorf("payout %s is still %s", p.ID, p.State)
			}
		}
		return true, nil
	})
	all := s.payouts(t, "")
	if len(all) != payouts {
		t.Fatalf("%d payouts, want %d", len(all), payouts)
	}
	for _, p := range all {
		if p.State != pc.Posted && p.State != pc.Failed && p.State != pc.RailAmbiguous {
			t.Errorf("payout %s ended %s", p.ID, p.State)
		}
	}
	c := countStates(all)
	t.Logf("outcomes: %v", c)
	if c[pc.Posted] == 0 || c[pc.Failed] == 0 || c[pc.RailAmbiguous] == 0 {
		t.Errorf("expected every outcome with these faults, got %v", c)
	}
	s.checkMoney(t, all, opening)
	for _, p := range all {
		if p.State == pc.Failed && strings.HasPrefix(p.BeneficiaryRef, "DECLINE") && p.FailureReason == "" {
			t.Errorf("declined payout %s has no failure reason", p.ID)
		}
	}
	for _, e := range execs[:2] {
		stopExecutor(t, e)
	}
	// Nobody was fenced out: the executors never overlapped on an account.
	for _, ev := range s.paySafetyEvents(t) {
		if ev.Kind == pc.KindFencedOut || ev.Kind == pc.KindTokenRegression {
			t.Errorf("unexpected safety event at the payment resource: %+v", ev)
		}
	}
}

// TestExecutorRecoversFromSIGKILLInEachState kills an executor right after
// each step (its own crash hook) and the proxy at each of its crash points;
// another executor must complete or correctly classify every payout.
func TestExecutorRecoversFromSIGKILLInEachState(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	// No scenario here is a rail timeout: a generous one keeps a slow rail
	// call from turning a payout that must be POSTED ambiguous.
	s := startSystem(t, stack.Options{SettlementWindow: 2 * time.Second, RailTimeout: steadyRailTimeout})
	opening := map[string]int64{}
	type scenario struct {
		point executor.Point
		want  pc.State
	}
	scenarios := []scenario{
		{executor.AfterClaimed, pc.Posted},    // CLAIMED by a dead holder: re-claimed, then paid once
		{executor.AfterSubmitting, pc.Posted}, // RAIL_SUBMITTED, never forwarded: submitted now
		{executor.AfterSubmitted, pc.Posted},  // forwarded and ACKED, not reported: outcome applied, no resubmit
		{executor.AfterOutcome, pc.Posted},    // RAIL_ACKED: posting completed
	}
	var ids []string
	for i, sc := range scenarios {
		acc := fmt.Sprintf("kill-%d", i)
		opening[acc] = 100_000
		s.createAccount(t, acc, opening[acc])
		id := fmt.Sprintf("pk-%d", i)
		ids = append(ids, id)
		s.createPayout(t, id, acc, 1234, "BEN-kill")
		victim := s.startExecutor(t, "victim-"+string(sc.point), []string{executor.CrashAfterEnv + "=" + string(sc.point)}, "--concurrency", "1")
		code, err := victim.Wait(2 * time.Minute)
		if err != nil || code != executor.CrashExitCode {
			t.Fatalf("victim %s: exit %d, %v\n%s", sc.point, code, err, victim.Log())
		}
		if p := s.payout(t, id); p.State.Terminal() {
			t.Fatalf("payout %s is already %s after a crash at %s", id, p.State, sc.point)
		}
	}
	rescuer := s.startExecutor(t, "rescuer", nil)
	for i, sc := range scenarios {
		p := s.waitPayoutState(t, ids[i], 2*time.Minute, settledStates...)
		if p.State != sc.want {
			t.Errorf("after a crash at %s payout %s ended %s, want %s", sc.point, p.ID, p.State, sc.want)
		}
	}

	// The proxy crashes after writing intent (nothing sent) and after the
	// rail answered (money moved, outcome unrecorded). Neither may be
	// resubmitted: both are ambiguous until evidence resolves them.
	var restarted *proctest.Proc
	for i, point := range []string{"after_intent", "after_rail_answer"} {
		acc := fmt.Sprintf("proxy-kill-%d", i)
		opening[acc] = 100_000
		s.createAccount(t, acc, opening[acc])
		if restarted == nil {
			s.st.StopRole("proxy", 20*time.Second)
		} else if err := restarted.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		} else if code, err := restarted.Wait(time.Minute); err != nil || code != 0 {
			t.Fatalf("proxy stop: exit %d, %v", code, err)
		}
		// Every proxy over proxydb runs the stack's rail timeout.
		crashing := s.startProxy(t, "proxy-"+point, []string{"PAYOUTS_PROXY_CRASH_POINT=" + point}, steadyRailTimeout)
		id := fmt.Sprintf("pp-%d", i)
		ids = append(ids, id)
		s.createPayout(t, id, acc, 777, "BEN-proxy-kill")
		code, err := crashing.Wait(2 * time.Minute)
		if err != nil || code != 3 {
			t.Fatalf("proxy with crash point %s: exit %d, %v\n%s", point, code, err, crashing.Log())
		}
		restarted = s.startProxy(t, "proxy-after-"+point, nil, steadyRailTimeout)
		p := s.waitPayoutState(t, id, 2*time.Minute, settledStates...)
		if p.State != pc.RailAmbiguous {
			t.Errorf("after a proxy crash at %s payout %s ended %s, want RAIL_AMBIGUOUS", point, id, p.State)
		}
		all, err := s.proxy.GetAll(ctxT(t, 30*time.Second), id)
		if err != nil {
			t.Fatal(err)
		}
		forwarded := 0
		for _, r := range all {
			if r.Forwarded() {
				forwarded++
			}
		}
		if forwarded != 1 {
			t.Errorf("payout %s has %d forwarded submissions, want exactly 1: %+v", id, forwarded, all)
		}
		rail := s.railPayments(t)[pc.ClientRef(id)]
		if point == "after_intent" && len(rail) != 0 {
			t.Errorf("crash before the rail call, yet the rail holds %+v", rail)
		}
		if point == "after_rail_answer" && len(rail) != 1 {
			t.Errorf("crash after the rail's answer: the rail holds %d payments, want 1", len(rail))
		}
	}
	var all []pc.Payout
	for _, id := range ids {
		all = append(all, s.payout(t, id))
	}
	s.checkMoney(t, all, opening)
	stopExecutor(t, rescuer)
}

// TestExecutorUC03PausedHolderIsFencedAtBothGuards: two executors hold
// payouts (one after its claim, one after recording RAIL_SUBMITTED) and are
// frozen with SIGSTOP past their session TTL. A third one takes over and
// pays both. Thawed, the first two carry on as if nothing happened: their
// stale writes are fenced out at the payment resource and at the proxy,
// and the rail holds one payment per payout.
func TestExecutorUC03PausedHolderIsFencedAtBothGuards(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	// The stale holders are frozen, not the rail: a generous rail timeout
	// keeps a slow rail call from leaving a payout ambiguous, not POSTED.
	s := startSystem(t, stack.Options{SettlementWindow: 2 * time.Second, RailTimeout: steadyRailTimeout})
	opening := map[string]int64{"uc3-a": 50_000, "uc3-b": 50_000}
	for acc, bal := range opening {
		s.createAccount(t, acc, bal)
	}
	s.createPayout(t, "uc3-pa", "uc3-a", 4200, "BEN-uc3")
	s.createPayout(t, "uc3-pb", "uc3-b", 4300, "BEN-uc3")

	// Each stale executor works one account at a time, so each holds one.
	staleClaim := s.startExecutor(t, "stale-claimed", []string{executor.HoldAfterEnv + "=claimed"}, "--concurrency", "1")
	staleSubmit := s.startExecutor(t, "stale-submitting", []string{executor.HoldAfterEnv + "=submitting"}, "--concurrency", "1")
	held := map[*proctest.Proc]string{}
	for _, p := range []*proctest.Proc{staleClaim, staleSubmit} {
		if err := p.WaitLog(ctxT(t, 2*time.Minute), "test hook: holding"); err != nil {
			t.Fatal(err)
		}
		lines := logLines(p.Log(), "test hook: holding")
		held[p], _ = lines[0]["payout_id"].(string)
		if err := p.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	if held[staleClaim] == held[staleSubmit] || held[staleClaim] == "" {
		t.Fatalf("the stale executors should hold different payouts: %v", held)
	}
	if st := s.payout(t, held[staleClaim]).State; st != pc.Claimed {
		t.Fatalf("payout %s is %s, want CLAIMED while its holder is frozen", held[staleClaim], st)
	}
	if st := s.payout(t, held[staleSubmit]).State; st != pc.RailSubmitted {
		t.Fatalf("payout %s is %s, want RAIL_SUBMITTED while its holder is frozen", held[staleSubmit], st)
	}

	// Their sessions expire; a new holder takes both accounts and pays.
	taker := s.startExecutor(t, "taker", nil)
	for _, id := range []string{"uc3-pa", "uc3-pb"} {
		s.waitPayoutState(t, id, 2*time.Minute, pc.Posted)
	}

	// Thaw: the stale holders write with their old tokens.
	for _, p := range []*proctest.Proc{staleClaim, staleSubmit} {
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	for p, guard := range map[*proctest.Proc]string{staleClaim: "payment", staleSubmit: "proxy"} {
		if err := p.WaitLog(ctxT(t, 2*time.Minute), "fenced out: the "+guard+" guard refused our token"); err != nil {
			t.Fatalf("%s: %v\n%s", p.Name, err, tailLines(p.Log(), 30))
		}
	}
	var payFenced, proxyFenced bool
	for _, ev := range s.paySafetyEvents(t) {
		if ev.Kind == pc.KindFencedOut && ev.PayoutID == held[staleClaim] && ev.PresentedToken < ev.StoredToken {
			payFenced = true
		}
	}
	for _, ev := range s.proxySafetyEvents(t) {
		if ev.Kind == proxyclient.KindFencedOut && ev.PayoutID == held[staleSubmit] && ev.PresentedToken < ev.StoredToken {
			proxyFenced = true
		}
	}
	if !payFenced {
		t.Errorf("no fenced_out safety event at the payment resource for %s: %+v", held[staleClaim], s.paySafetyEvents(t))
	}
	if !proxyFenced {
		t.Errorf("no fenced_out safety event at the proxy for %s: %+v", held[staleSubmit], s.proxySafetyEvents(t))
	}
	all := []pc.Payout{s.payout(t, "uc3-pa"), s.payout(t, "uc3-pb")}
	for _, p := range all {
		if p.State != pc.Posted {
			t.Errorf("payout %s is %s after the stale writes, want POSTED", p.ID, p.State)
		}
		if n := len(s.railPayments(t)[p.ClientRef]); n != 1 {
			t.Errorf("the rail holds %d payments for %s, want 1", n, p.ClientRef)
		}
	}
	s.checkMoney(t, all, opening)
	stopExecutor(t, taker)
}

// TestExecutorFailsClosedWhileLockServiceDown: with the lock service gone
// the executor does nothing; when it returns, work resumes.
func TestExecutorFailsClosedWhileLockServiceDown(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	// The proxy waits long for the rail (see the second-signal check below).
	s := startSystem(t, stack.Options{SettlementWindow: 2 * time.Second, RailTimeout: 2 * time.Minute})
	s.createAccount(t, "fc-a", 100_000)
	s.createPayout(t, "fc-1", "fc-a", 100, "BEN-fc")
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	ex := s.startExecutor(t, "exec-fc", nil, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port))
	s.waitPayoutState(t, "fc-1", 2*time.Minute, pc.Posted)

	s.st.StopRole("lock", 20*time.Second)
	// The executor notices (jeopardy, then its session is lost) and keeps
	// failing to open a new session.
	if err := ex.WaitLog(ctxT(t, 2*time.Minute), "lock service unreachable: doing nothing"); err != nil {
		t.Fatalf("%v\n%s", err, tailLines(ex.Log(), 30))
	}
	for i := 2; i <= 4; i++ {
		s.createPayout(t, fmt.Sprintf("fc-%d", i), "fc-a", 100, "BEN-fc")
	}
	// Several more attempts to open a session fail while the payouts wait.
	failed := `payouts_executor_sessions_total{event="open_failed"}`
	start := metricValue(t, metricsURL, failed)
	waitUntil(t, 2*time.Minute, "three more failed session opens", func() (bool, error) {
		return metricValue(t, metricsURL, failed) >= start+3, nil
	})
	if v := metricValue(t, metricsURL, "payouts_executor_lock_unavailable"); v != 1 {
		t.Errorf("payouts_executor_lock_unavailable = %v while the lock service is down, want 1", v)
	}
	for i := 2; i <= 4; i++ {
		if p := s.payout(t, fmt.Sprintf("fc-%d", i)); p.State != pc.Pending {
			t.Fatalf("payout %s is %s while the lock service is down; want PENDING (fail closed)", p.ID, p.State)
		}
	}

	s.restartLock(t, "lock-again")
	for i := 2; i <= 4; i++ {
		s.waitPayoutState(t, fmt.Sprintf("fc-%d", i), 2*time.Minute, pc.Posted)
	}
	if err := ex.WaitLog(ctxT(t, time.Minute), "lock service reachable again"); err != nil {
		t.Fatal(err)
	}

	// A second signal does not wait for the step in flight. The rail takes
	// a minute to answer, so the first signal alone could not end it soon.
	slow := int64(60_000)
	if _, err := s.rail.SetFaults(ctxT(t, 30*time.Second), railclient.FaultsUpdate{LatencyMS: &slow}); err != nil {
		t.Fatal(err)
	}
	s.createPayout(t, "fc-5", "fc-a", 100, "BEN-fc")
	s.waitPayoutState(t, "fc-5", 2*time.Minute, pc.RailSubmitted)
	if err := ex.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := ex.WaitLog(ctxT(t, time.Minute), "stop requested"); err != nil {
		t.Fatal(err)
	}
	if err := ex.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := ex.Wait(45 * time.Second); err != nil || code != 1 {
		t.Fatalf("after a second SIGTERM: exit %d, %v; want 1 at once\n%s", code, err, tailLines(ex.Log(), 20))
	}
	if !strings.Contains(ex.Log(), "second signal: exiting at once") {
		t.Fatalf("no second-signal log line:\n%s", tailLines(ex.Log(), 20))
	}
}

// runCLI runs the payouts binary and returns stdout, stderr and the exit code.
func runCLI(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(proctest.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

// TestPayoutOperatorCLI drives `payouts payout create|show|list|cancel|abandon`.
func TestPayoutOperatorCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSystem(t, stack.Options{SettlementWindow: 2 * time.Second, RailTimeout: time.Second})
	r := s.st.Ready
	env := []string{"PAYOUTS_TOKEN=" + r.Tokens.Operator, "PAYOUTS_PAYMENT_URL=" + r.PaymentURL, "PAYOUTS_LOCK_URL=" + r.LockURL, "PAYOUTS_PROXY_URL=" + r.ProxyURL}
	s.createAccount(t, "cli-a", 100_000)

	out, errOut, code := runCLI(t, env, "payout", "create", "--id", "cli-1", "--account", "cli-a", "--amount", "1500",
		"--currency", "EUR", "--beneficiary", "BEN-cli", "--output", "json")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	var p pc.Payout
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.ID != "cli-1" || p.State != pc.Pending || p.Amount != 1500 {
		t.Fatalf("create printed %q (%v)", out, err)
	}
	if out, _, code = runCLI(t, env, "payout", "show", "cli-1"); code != 0 || !strings.Contains(out, "PENDING") || !strings.Contains(out, "client_ref") {
		t.Fatalf("show (table): exit %d:\n%s", code, out)
	}
	out, _, code = runCLI(t, env, "payout", "list", "--state", "pending", "--account", "cli-a", "-o", "json")
	var list pc.List[pc.Payout]
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Items) != 1 || list.Items[0].ID != "cli-1" {
		t.Fatalf("list: exit %d: %s", code, out)
	}
	// Bad input is refused before anything is sent, naming the flag.
	if _, errOut, code = runCLI(t, env, "payout", "cancel", "cli-1"); code != 2 || !strings.Contains(errOut, "--reason") {
		t.Fatalf("cancel without --reason: exit %d: %s", code, errOut)
	}
	if _, errOut, code = runCLI(t, env, "payout", "list", "--output", "yaml"); code != 2 || !strings.Contains(errOut, "--output") {
		t.Fatalf("list --output yaml: exit %d: %s", code, errOut)
	}
	// cancel takes the account's lock and presents its token.
	out, errOut, code = runCLI(t, env, "payout", "cancel", "cli-1", "--reason", "customer withdrew", "-o", "json")
	if code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.State != pc.Abandoned || p.Token <= 0 {
		t.Fatalf("cancel printed %q (%v)", out, err)
	}
	events, err := s.pay.PayoutEvents(ctxT(t, 30*time.Second), "cli-1", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := events.Items[len(events.Items)-1]
	if last.ToState != pc.Abandoned || last.Reason != "customer withdrew" || last.Token <= 0 || last.Holder == "" {
		t.Fatalf("cancel event %+v: want the reason, a token and a holder", last)
	}
	out, _, code = runCLI(t, env, "payout", "show", "cli-1", "--events", "-o", "json")
	var shown struct {
		Payout pc.Payout        `json:"payout"`
		Events []pc.PayoutEvent `json:"events"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &shown) != nil || shown.Payout.State != pc.Abandoned || len(shown.Events) != len(events.Items) {
		t.Fatalf("show --events: exit %d: %s", code, out)
	}
	if out, _, code = runCLI(t, env, "payout", "show", "cli-1", "--events"); code != 0 || !strings.Contains(out, "customer withdrew") {
		t.Fatalf("show --events (table): exit %d:\n%s", code, out)
	}
	// A second cancel is an invalid transition: exit 1 with the code shown.
	if _, errOut, code = runCLI(t, env, "payout", "cancel", "cli-1", "--reason", "again"); code != 1 || !strings.Contains(errOut, "invalid_transition") {
		t.Fatalf("second cancel: exit %d: %s", code, errOut)
	}

	// abandon: make a payout ambiguous (the rail accepts, then never answers).
	one := 1.0
	if _, err := s.rail.SetFaults(ctxT(t, 30*time.Second), railclient.FaultsUpdate{TimeoutAfterAccept: &one}); err != nil {
		t.Fatal(err)
	}
	s.createPayout(t, "cli-2", "cli-a", 900, "BEN-cli")
	ex := s.startExecutor(t, "exec-cli", nil)
	s.waitPayoutState(t, "cli-2", 2*time.Minute, pc.RailAmbiguous)
	out, errOut, code = runCLI(t, env, "payout", "abandon", "cli-2", "--reason", "past SLA; finance ticket FIN-1", "-o", "json")
	if code != 0 {
		t.Fatalf("abandon: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &p); err != nil || p.State != pc.Abandoned {
		t.Fatalf("abandon printed %q (%v)", out, err)
	}
	stopExecutor(t, ex)
	if _, errOut, code = runCLI(t, env, "payout", "show", "no-such-payout"); code != 1 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("show of a missing payout: exit %d: %s", code, errOut)
	}
}

func metricValue(t *testing.T, url, sample string) float64 {
	t.Helper()
	return proctest.Metric(t, url, sample)
}

// TestExecutorWithAnotherRolesTokenClaimsNothing: an executor given an
// operator's token (which the payment resource lets claim, and the proxy
// does not let submit) stops at its start, exit 2 naming the proxy, before
// it claims anything; the payout waiting stays PENDING for a correctly
// configured executor.
func TestExecutorWithAnotherRolesTokenClaimsNothing(t *testing.T) {
	s := startSystem(t, stack.Options{})
	r := s.st.Ready
	s.createAccount(t, "wrong-tok-acc", 10_000)
	s.createPayout(t, "wrong-tok-1", "wrong-tok-acc", 100, "ben-1")
	p := proctest.Start(t, "executor-operator-token", []string{"PAYOUTS_TOKEN=" + r.Tokens.Operator},
		"run", "executor", "--owner", "wrong-token", "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
		"--proxy-url", r.ProxyURL, "--poll-interval", "100ms")
	code, err := p.Wait(2 * time.Minute)
	if err != nil || code != 2 {
		t.Fatalf("executor with an operator token: exit %d, %v; want 2\n%s", code, err, tailLines(p.Log(), 20))
	}
	if !strings.Contains(p.Log(), "rail proxy") || !strings.Contains(p.Log(), "refused the token") || !strings.Contains(p.Log(), "role operator") {
		t.Errorf("the executor's log does not say the proxy refused its operator token:\n%s", tailLines(p.Log(), 20))
	}
	if got := s.payout(t, "wrong-tok-1"); got.State != pc.Pending || got.Token != 0 {
		t.Fatalf("payout after the executor with the wrong token: %s (token %d), want PENDING, never claimed", got.State, got.Token)
	}
	ex := s.startExecutor(t, "executor-right-token", nil)
	s.waitPayoutState(t, "wrong-tok-1", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)
}
