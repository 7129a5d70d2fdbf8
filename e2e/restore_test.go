package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// startPGLock starts a lock service on the PostgreSQL backend at the
// stack's lock address (after st.StopRole("lock", ...)).
func (s *system) startPGLock(t *testing.T, name, lockDB string) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	p := proctest.Start(t, name, nil, "serve", "lock", "--listen", hostPort(t, r.LockURL),
		"--auth-file", filepath.Join(r.Dir, "auth.json"), "--backend", "postgres", "--database-url", lockDB)
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.LockURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// stopProc sends SIGTERM and waits for the process to be gone.
func stopProc(t *testing.T, p *proctest.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.Name, err)
	}
	if _, err := p.Wait(time.Minute); err != nil {
		p.Kill()
	}
}

func hasFinding(out reconcileOut, invariant, check string) bool {
	for _, f := range out.Findings {
		if f.Invariant == invariant && f.Check == check {
			return true
		}
	}
	return false
}

// restoreRig is a system whose lock service runs on the PostgreSQL backend,
// with lockdb in a cluster of its own (fsync on) so that rewinding it
// rewinds the lock service only, and a base backup of lockdb taken while
// the tokens were still low: payouts ran before and after the backup, and
// the live sequence jumped past it, so the guards' fences are far above
// what the backup knows.
type restoreRig struct {
	s          *system
	lockPG     *infra.PGCluster
	lockDB     string
	lockProc   *proctest.Proc
	backup     string
	backupHigh fencing.Token
	highest    fencing.Token // the guards' highest fence
	account    string
	ex         *proctest.Proc
}

const restoreAdvance = 1_000_000

func setupRestore(t *testing.T, prefix string) *restoreRig {
	t.Helper()
	// Every payout must end POSTED and no rail timeout is under test.
	s := startSystem(t, stack.Options{SettlementWindow: time.Second, RailTimeout: steadyRailTimeout})
	ctx := ctxT(t, 5*time.Minute)
	r := &restoreRig{s: s, account: prefix + "-a"}

	var err error
	r.lockPG, err = infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(t.TempDir(), "lockpg"), Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.lockPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.lockPG.Stop() })
	if err := r.lockPG.CreateDatabase(ctx, "lockdb", ""); err != nil {
		t.Fatal(err)
	}
	r.lockDB = r.lockPG.URL("lockdb")
	if err := migrations.Apply(ctx, migrations.LockDB, r.lockDB); err != nil {
		t.Fatal(err)
	}
	s.st.StopRole("lock", 20*time.Second)
	r.lockProc = s.startPGLock(t, "lock-pg", r.lockDB)

	s.createAccount(t, r.account, 10_000_000)
	// A steady TTL: both tests require no safety event but those the
	// restore causes, so a stall must not lapse the session and have a
	// correct takeover fence out the executor's own writes.
	r.ex = s.startSteadyExecutor(t, prefix+"-executor", nil)
	r.runPayouts(t, prefix+"-before")

	// The backup: a consistent copy of lockdb as it is now.
	r.backup = filepath.Join(r.lockPG.Dir(), "basebackup")
	if err := r.lockPG.BaseBackup(ctx, r.backup); err != nil {
		t.Fatal(err)
	}
	if r.backupHigh, err = s.lock.HighToken(ctx); err != nil {
		t.Fatal(err)
	}

	// Tokens advance well past the backup: payouts under new grants, then a
	// jump of the live sequence (as months of grants would), then more
	// payouts whose fences the guards store. The jump keeps the gap larger
	// than what a fenced-out executor, which takes a fresh grant on each
	// retry, could climb through during the test.
	r.runPayouts(t, prefix+"-between")
	if _, errOut, code := runCLI(t, nil, "lock", "bump-tokens", "--to", strconv.Itoa(restoreAdvance), "--database-url", r.lockDB); code != 0 {
		t.Fatalf("advance the live token sequence: exit %d: %s", code, errOut)
	}
	r.runPayouts(t, prefix+"-after-backup")
	payHigh, err := s.pay.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxyHigh, err := s.proxy.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.highest = max(payHigh, proxyHigh)
	if r.highest <= restoreAdvance {
		t.Fatalf("guards' highest fence %d (paydb %d, proxy %d), want above %d", r.highest, payHigh, proxyHigh, restoreAdvance)
	}
	if n := len(s.paySafetyEvents(t)) + len(s.proxySafetyEvents(t)); n != 0 {
		t.Fatalf("%d safety events before the restore, want none", n)
	}
	return r
}

// runPayouts creates two payouts on the rig's account and waits for both
// to be posted and the account's lock to be given back.
func (r *restoreRig) runPayouts(t *testing.T, prefix string) {
	t.Helper()
	for i := 0; i < 2; i++ {
		r.s.createPayout(t, fmt.Sprintf("%s-%d", prefix, i), r.account, 100, "BEN-rs")
	}
	for i := 0; i < 2; i++ {
		r.s.waitPayoutState(t, fmt.Sprintf("%s-%d", prefix, i), 2*time.Minute, pc.Posted)
	}
	r.s.waitLockFree(t, fencing.Key(r.account))
}

// waitLockFree waits until nobody holds key. An executor keeps an
// account's grant for --grant-linger after the account's work runs out;
// the restore tests need each batch of payouts paid under a grant of its
// own, taken after the tokens advanced, and backups taken with the key
// free, as it is when nothing is being paid.
func (s *system) waitLockFree(t *testing.T, key string) {
	t.Helper()
	waitUntil(t, 2*time.Minute, key+" to be released", func() (bool, error) {
		l, err := s.lock.Lock(ctxT(t, 30*time.Second), key)
		return err == nil && !l.Held, err
	})
}

// replaceLockDB stops the lock service and lockdb's cluster, puts the base
// backup in place of the data directory (as a standby when asked) and
// starts the cluster again. The executor keeps running.
func (r *restoreRig) replaceLockDB(t *testing.T, ctx context.Context, standby bool) {
	t.Helper()
	stopProc(t, r.lockProc)
	if err := r.lockPG.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(r.lockPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	// pg_basebackup ran as the server user, so the copy is already its own.
	if err := os.Rename(r.backup, r.lockPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	if standby {
		// A replica that stopped receiving WAL when the backup was taken:
		// it replays what it has and waits for more, read-only.
		if err := os.WriteFile(filepath.Join(r.lockPG.DataDir(), "standby.signal"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.lockPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreLockDBFromBaseBackup is DESIGN §5 "Restore" and D-13 for the
// PostgreSQL lock backend.
//
// Without D-13 the restored token sequence re-issues tokens below what the
// guards store: every write is fenced out, nothing is paid twice, and the
// reconciler reports the regression with the highest fence. With D-13
// (`payouts lock bump-tokens --to <highest fence>`) new grants are above
// every fence and the waiting payouts complete.
func TestRestoreLockDBFromBaseBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	r := setupRestore(t, "rs")
	s, lockDB, account, backupHigh, highest, ex := r.s, r.lockDB, r.account, r.backupHigh, r.highest, r.ex
	ctx := ctxT(t, 5*time.Minute)
	const advance = restoreAdvance

	// Restore lockdb from the backup and start the lock service on it.
	r.replaceLockDB(t, ctx, false)
	s.startPGLock(t, "lock-pg-restored", lockDB)
	restoredHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if restoredHigh >= highest || restoredHigh < backupHigh {
		t.Fatalf("after the restore the lock service's high token is %d; want the backup's (%d) or a little above, below the fences (%d)",
			restoredHigh, backupHigh, highest)
	}

	// Without D-13: every write under a re-issued (lower) token is fenced out.
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("rs-restored-%d", i), account, 100, "BEN-rs")
	}
	key := fencing.Key(account)
	var fenced int
	waitUntil(t, 2*time.Minute, "the guards to fence out the restored lock service's tokens", func() (bool, error) {
		fenced = 0
		for _, e := range s.paySafetyEvents(t) {
			if e.Kind == pc.KindFencedOut && e.Key == key && e.PresentedToken < e.StoredToken && e.StoredToken > advance {
				fenced++
			}
		}
		if fenced < 3 {
			return false, fmt.Errorf("%d fenced_out events on %s", fenced, key)
		}
		return true, nil
	})
	// Both guards: a grant of the restored lock service, presented at the
	// payment resource and at the proxy, is fenced out at each (the
	// executor's own writes stop at the first, its claim).
	tok, claimErr, submitErr := s.staleProbe(t, key, s.payout(t, "rs-restored-0"))
	if tok >= highest {
		t.Fatalf("the restored lock service granted %d, not below the guards' highest fence %d", tok, highest)
	}
	s.requireFencedAtBothGuards(t, tok, claimErr, submitErr)
	for i := 0; i < 2; i++ {
		if p := s.payout(t, fmt.Sprintf("rs-restored-%d", i)); p.State != pc.Pending {
			t.Fatalf("payout %s is %s under a rewound lock service; want PENDING (fenced out)", p.ID, p.State)
		}
	}
	for ref, items := range s.railPayments(t) {
		if len(items) > 1 {
			t.Fatalf("client reference %s paid %d times at the rail", ref, len(items))
		}
	}
	out, log, code := s.reconcileOnce(t, "--json")
	if code != 1 || !hasFinding(out, "INV-04", "lock_service_rewound") {
		t.Fatalf("reconcile after the restore: exit %d, want 1 with an INV-04 lock_service_rewound finding\n%s", code, log)
	}
	if out.HighestFence != int64(highest) || out.LockHighToken >= out.HighestFence {
		t.Fatalf("reconcile printed highest_fence %d, lock_high_token %d; want %d and below it", out.HighestFence, out.LockHighToken, highest)
	}
	if !hasFinding(out, "INV-05", "fenced_out") {
		t.Fatalf("reconcile does not report the fenced_out events:\n%s", log)
	}

	// D-13: bump the token sequence to the highest fence the reconciler printed.
	stdout, errOut, code := runCLI(t, nil, "lock", "bump-tokens", "--to", strconv.FormatInt(out.HighestFence, 10),
		"--database-url", lockDB, "--output", "json")
	if code != 0 {
		t.Fatalf("bump-tokens: exit %d: %s", code, errOut)
	}
	var bumped struct {
		From int64 `json:"from"`
		To   int64 `json:"to"`
	}
	if err := json.Unmarshal([]byte(stdout), &bumped); err != nil || bumped.To != out.HighestFence || bumped.From >= bumped.To {
		t.Fatalf("bump-tokens printed %q (%v)", stdout, err)
	}
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rs-restored-%d", i), 2*time.Minute, pc.Posted)
	}
	s.createPayout(t, "rs-bumped", account, 100, "BEN-rs")
	s.waitPayoutState(t, "rs-bumped", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)

	lockHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lockHigh <= highest {
		t.Fatalf("lock service high token %d after bump-tokens, want above %d", lockHigh, highest)
	}
	all := s.payouts(t, account)
	s.checkMoney(t, all, map[string]int64{account: 10_000_000})
	out, log, code = s.reconcileOnce(t, "--json")
	if code == 2 || hasFinding(out, "INV-04", "lock_service_rewound") || hasFinding(out, "INV-04", "token_regression") ||
		hasFinding(out, "INV-04", "high_water_above_fence") {
		t.Fatalf("reconcile after bump-tokens: exit %d, still reports a token regression\n%s", code, log)
	}
	if out.LockHighToken < out.HighestFence {
		t.Fatalf("after bump-tokens lock_high_token %d < highest_fence %d", out.LockHighToken, out.HighestFence)
	}
	// The fenced-out attempts stay on record as evidence.
	if !hasFinding(out, "INV-05", "fenced_out") {
		t.Fatalf("the fenced_out evidence disappeared:\n%s", log)
	}
	// The grants issued between the backup and the restore are gone from
	// the restored grant log, so the writes made under them stay reported
	// as without a grant (INV-07): both the ledger entries and the rail
	// submissions. Nothing written under a later token may be.
	lostGrants := map[string]int{}
	for _, f := range out.Findings {
		switch f.Check {
		case "fenced_out":
		case "ledger_without_grant", "submission_without_grant":
			tok, _ := f.Objects["token"].(float64)
			if tok <= float64(backupHigh) || tok > float64(highest) {
				t.Errorf("finding for a token outside the lost grants (%d, %d]: %+v", backupHigh, highest, f)
			} else {
				lostGrants[f.Check]++
			}
		default:
			t.Errorf("unexpected finding after bump-tokens: %+v", f)
		}
	}
	requireLostGrantFindings(t, lostGrants, backupHigh, highest, log)
}

// requireLostGrantFindings requires INV-07 to report the writes made under
// the grants a restore lost: at least one ledger entry and one rail
// submission under a token in (low, high], as counted by check in found.
func requireLostGrantFindings(t *testing.T, found map[string]int, low, high fencing.Token, log string) {
	t.Helper()
	for _, check := range []string{"ledger_without_grant", "submission_without_grant"} {
		if found[check] == 0 {
			t.Errorf("no INV-07 %s finding for a token in (%d, %d]: the writes made under the lost grants must stay reported\n%s",
				check, low, high, log)
		}
	}
}

// TestPromotedReplicaLockDB is the lockdb failover case of D-13: the lock
// service's database fails over to an asynchronous replica that never
// received the last grants (here: a replica that stopped receiving WAL when
// the base backup was taken, promoted to a new timeline). The failover
// procedure runs `payouts lock bump-tokens --from-guards` before the lock
// service grants on the promoted database: no write is fenced out, nothing
// is paid twice, every payout completes and the reconciler reports no token
// regression.
func TestPromotedReplicaLockDB(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	r := setupRestore(t, "pr")
	s := r.s
	ctx := ctxT(t, 5*time.Minute)

	r.replaceLockDB(t, ctx, true)
	conn, err := pgx.Connect(ctx, r.lockPG.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var promoted bool
	err = conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&promoted)
	conn.Close(context.Background())
	if err != nil || !promoted {
		t.Fatalf("promote the replica: %v (promoted %v)", err, promoted)
	}

	// The failover procedure (docs/lock-service.md): bump above both guards'
	// fences, then start the lock service on the promoted database.
	rd := s.st.Ready
	stdout, errOut, code := runCLI(t, nil, "lock", "bump-tokens", "--from-guards", "--database-url", r.lockDB,
		"--payment-url", rd.PaymentURL, "--proxy-url", rd.ProxyURL, "--token", rd.Tokens.Reconciler, "--output", "json")
	if code != 0 {
		t.Fatalf("bump-tokens --from-guards: exit %d: %s", code, errOut)
	}
	var bumped struct {
		From int64 `json:"from"`
		To   int64 `json:"to"`
	}
	if err := json.Unmarshal([]byte(stdout), &bumped); err != nil || bumped.To <= int64(r.highest) || bumped.From >= int64(r.highest) {
		t.Fatalf("bump-tokens --from-guards printed %q (%v); want from below and to above the guards' highest fence %d", stdout, err, r.highest)
	}
	s.startPGLock(t, "lock-pg-promoted", r.lockDB)

	r.runPayouts(t, "pr-promoted")
	stopExecutor(t, r.ex)
	if n := len(s.paySafetyEvents(t)) + len(s.proxySafetyEvents(t)); n != 0 {
		t.Fatalf("%d safety events after the failover procedure, want none (no write fenced out)", n)
	}
	for ref, items := range s.railPayments(t) {
		if len(items) > 1 {
			t.Fatalf("client reference %s paid %d times at the rail", ref, len(items))
		}
	}
	lockHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lockHigh <= r.highest {
		t.Fatalf("lock service high token %d on the promoted replica, want above the guards' %d", lockHigh, r.highest)
	}
	s.checkMoney(t, s.payouts(t, r.account), map[string]int64{r.account: 10_000_000})
	out, log, code := s.reconcileOnce(t, "--json")
	if code == 2 || hasFinding(out, "INV-04", "lock_service_rewound") || hasFinding(out, "INV-04", "token_regression") {
		t.Fatalf("reconcile after the failover: exit %d, reports a token regression\n%s", code, log)
	}
	// The writes made under the grants the replica never received stay
	// reported as without a grant (INV-07): both the ledger entries and
	// the rail submissions. Nothing written under a later token may be.
	lostGrants := map[string]int{}
	for _, f := range out.Findings {
		switch f.Check {
		case "ledger_without_grant", "submission_without_grant":
			tok, _ := f.Objects["token"].(float64)
			if tok <= float64(r.backupHigh) || tok > float64(r.highest) {
				t.Errorf("finding for a token outside the lost grants (%d, %d]: %+v", r.backupHigh, r.highest, f)
			} else {
				lostGrants[f.Check]++
			}
		default:
			t.Errorf("unexpected finding after the failover: %+v", f)
		}
	}
	requireLostGrantFindings(t, lostGrants, r.backupHigh, r.highest, log)
}
