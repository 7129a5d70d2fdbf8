package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// saveEtcdSnapshot streams a snapshot of the cluster (clientv3
// Maintenance.Snapshot, what `etcdctl snapshot save` does) into path.
func saveEtcdSnapshot(ctx context.Context, t *testing.T, c *infra.EtcdCluster, path string) {
	t.Helper()
	cli, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatalf("etcd snapshot: %v", err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		t.Fatalf("etcd snapshot: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// restoreEtcd restores the snapshot into a new single-member cluster (what
// `etcdutl snapshot restore [--bump-revision N --mark-compacted]` does) and
// starts it. bump 0 restores as is.
func restoreEtcd(ctx context.Context, t *testing.T, snap string, bump uint64) *infra.EtcdCluster {
	t.Helper()
	dir := filepath.Join(t.TempDir(), fmt.Sprintf("etcd-restored-bump%d", bump))
	cp, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pp, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The member's name, peer URL and cluster token as infra.StartEtcd
	// will configure them for dir, so it starts on the restored data.
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: snap, Name: "etcd0", OutputDataDir: filepath.Join(dir, "etcd0"), PeerURLs: []string{peer},
		InitialCluster: "etcd0=" + peer, InitialClusterToken: "payouts-" + filepath.Base(dir),
		RevisionBump: bump, MarkCompacted: bump > 0,
	})
	if err != nil {
		t.Fatalf("etcd snapshot restore (bump %d): %v", bump, err)
	}
	c, err := infra.StartEtcd(ctx, dir, 1, cp, pp)
	if err != nil {
		t.Fatalf("start the restored etcd: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// startEtcdLock starts a lock service on the stack's lock address against
// the given etcd endpoints.
func (s *system) startEtcdLock(t *testing.T, name string, c *infra.EtcdCluster) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	args := []string{"serve", "lock", "--listen", hostPort(t, r.LockURL), "--auth-file", filepath.Join(r.Dir, "auth.json"),
		"--backend", "etcd", "--etcd-endpoints", c.Endpoints()[0]}
	p := proctest.Start(t, name, nil, args...)
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.LockURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// staleProbe takes a grant on key from the lock service as it now stands
// and presents its token to both guards for payout p: claim at the payment
// resource, submission at the proxy. It returns the token and the errors.
func (s *system) staleProbe(t *testing.T, key string, p pc.Payout) (fencing.Token, error, error) {
	t.Helper()
	r := s.st.Ready
	ctx := ctxT(t, 3*time.Minute)
	sess, err := lockclient.Open(ctx, r.LockURL, "restore-probe", lockclient.WithToken(r.Tokens.Executor))
	if err != nil {
		t.Fatalf("open a lock session: %v", err)
	}
	defer func() { _ = sess.Close(ctx) }()
	g, err := sess.Acquire(ctx, key, 2*time.Minute)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	defer func() { _ = sess.Release(ctx, g) }()
	pay, err := pc.New(r.PaymentURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := proxyclient.New(r.ProxyURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	_, claimErr := pay.Claim(ctx, p.ID, g.Token, g.Holder())
	_, submitErr := proxy.Submit(ctx, proxyclient.Submission{PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef,
		Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, g.Token, g.Holder())
	return g.Token, claimErr, submitErr
}

// requireFencedAtBothGuards fails t unless the probe under token tok was
// fenced out at the payment resource (claimErr) and at the proxy
// (submitErr), the proxy recording one fenced_out event for it.
func (s *system) requireFencedAtBothGuards(t *testing.T, tok fencing.Token, claimErr, submitErr error) {
	t.Helper()
	if !problem.Has(claimErr, problem.FencedOut) {
		t.Fatalf("claim under re-issued token %d: %v, want fenced_out at the payment resource", tok, claimErr)
	}
	if !problem.Has(submitErr, problem.FencedOut) {
		t.Fatalf("submission under re-issued token %d: %v, want fenced_out at the proxy", tok, submitErr)
	}
	proxyFenced := 0
	for _, e := range s.proxySafetyEvents(t) {
		if e.Kind == proxyclient.KindFencedOut && e.PresentedToken == tok {
			proxyFenced++
		}
	}
	if proxyFenced != 1 {
		t.Fatalf("%d proxy fenced_out events for token %d, want 1", proxyFenced, tok)
	}
}

// TestRestoreEtcdFromSnapshot is D-13 for the etcd lock backend (INV-04).
// A snapshot taken earlier is restored twice:
//
//   - as is: the revision, and with it the token, goes back. New grants get
//     token values the lock service had already issued; both guards fence
//     them out, nothing is paid twice, and the reconciler reports the lock
//     service rewound (INV-04).
//   - with --bump-revision above the guards' highest fence and
//     --mark-compacted: every new token is above every fence and the
//     waiting payouts complete.
func TestRestoreEtcdFromSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	// Every payout must end POSTED and no rail timeout is under test.
	s := startSystem(t, stack.Options{SettlementWindow: time.Second, RailTimeout: steadyRailTimeout})
	ctx := ctxT(t, 10*time.Minute)
	const account = "re-a"
	key := fencing.Key(account)
	s.createAccount(t, account, 10_000_000)
	ex := s.startExecutor(t, "re-executor", nil)
	pay := func(prefix string, n int) {
		for i := 0; i < n; i++ {
			s.createPayout(t, fmt.Sprintf("%s-%d", prefix, i), account, 100, "BEN-re")
		}
		for i := 0; i < n; i++ {
			s.waitPayoutState(t, fmt.Sprintf("%s-%d", prefix, i), 2*time.Minute, pc.Posted)
		}
		s.waitLockFree(t, key) // the next payouts take a grant of their own
	}
	pay("re-before", 2)

	snap := filepath.Join(t.TempDir(), "etcd.snapshot")
	saveEtcdSnapshot(ctx, t, s.st.Etcd(), snap)
	snapHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The cluster moves on after the snapshot: other writes to etcd (as
	// months of grants would make), then payouts whose fences the guards
	// store. The gap keeps the restored revision below the fences for
	// longer than a fenced-out executor, taking a fresh grant on each
	// retry, could climb during the test.
	cli, err := s.st.Etcd().Client()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ {
		if _, err := cli.Put(ctx, "/restore-test/filler", fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	pay("re-between", 2)
	issuedHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	payHigh, err := s.pay.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxyHigh, err := s.proxy.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	highest := max(payHigh, proxyHigh)
	if highest <= snapHigh+2000 {
		t.Fatalf("guards' highest fence %d (paydb %d, proxy %d), want above the snapshot's token %d + 2000", highest, payHigh, proxyHigh, snapHigh)
	}

	// Restore without the procedure: lock service and etcd stopped, etcd
	// restored from the snapshot, the lock service started on it. The
	// executor keeps running.
	s.st.StopRole("lock", 20*time.Second)
	s.st.Etcd().Close()
	restored := restoreEtcd(ctx, t, snap, 0)
	lockProc := s.startEtcdLock(t, "lock-etcd-restored", restored)
	restoredHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if restoredHigh >= highest || restoredHigh < snapHigh {
		t.Fatalf("after the restore the lock service's high token is %d; want the snapshot's (%d) or a little above, below the fences (%d)",
			restoredHigh, snapHigh, highest)
	}
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("re-restored-%d", i), account, 100, "BEN-re")
	}
	// A grant from the restored service re-uses a token value already
	// issued before the restore, and both guards refuse it.
	tok, claimErr, submitErr := s.staleProbe(t, key, s.payout(t, "re-restored-0"))
	if tok > issuedHigh {
		t.Fatalf("the restored lock service granted %d, above the %d issued before the restore: it did not go back", tok, issuedHigh)
	}
	s.requireFencedAtBothGuards(t, tok, claimErr, submitErr)
	// The executor's own grants are fenced out too.
	waitUntil(t, 2*time.Minute, "the payment guard to fence out the executor's re-issued tokens", func() (bool, error) {
		n := 0
		for _, e := range s.paySafetyEvents(t) {
			if (e.Kind == pc.KindFencedOut || e.Kind == pc.KindTokenRegression) && e.Key == key && e.PresentedToken <= e.StoredToken &&
				e.StoredToken >= highest && e.PresentedToken != tok {
				n++
			}
		}
		if n < 2 {
			return false, fmt.Errorf("%d fenced_out events from the executor on %s", n, key)
		}
		return true, nil
	})
	for i := 0; i < 2; i++ {
		if p := s.payout(t, fmt.Sprintf("re-restored-%d", i)); p.State != pc.Pending {
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

	// D-13: restore the same snapshot again, the revision bumped past the
	// highest fence the reconciler printed, and marked compacted.
	stopProc(t, lockProc)
	restored.Close()
	bumped := restoreEtcd(ctx, t, snap, uint64(out.HighestFence))
	s.startEtcdLock(t, "lock-etcd-bumped", bumped)
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("re-restored-%d", i), 2*time.Minute, pc.Posted)
	}
	pay("re-bumped", 1)
	stopExecutor(t, ex)

	lockHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lockHigh <= highest {
		t.Fatalf("lock service high token %d after the bumped restore, want above %d", lockHigh, highest)
	}
	s.checkMoney(t, s.payouts(t, account), map[string]int64{account: 10_000_000})
	out, log, code = s.reconcileOnce(t, "--json")
	if code == 2 || hasFinding(out, "INV-04", "lock_service_rewound") || hasFinding(out, "INV-04", "token_regression") ||
		hasFinding(out, "INV-04", "high_water_above_fence") {
		t.Fatalf("reconcile after the bumped restore: exit %d, still reports a token regression\n%s", code, log)
	}
	// The grants made between the snapshot and the restore are gone from
	// the restored grant log, so the writes made under them stay reported
	// as without a grant (INV-07); the fenced-out attempts stay on record.
	for _, f := range out.Findings {
		switch f.Check {
		case "fenced_out":
		case "ledger_without_grant", "submission_without_grant":
			tok, _ := f.Objects["token"].(float64)
			if tok <= float64(snapHigh) || tok > float64(highest) {
				t.Errorf("finding for a token outside the lost grants (%d, %d]: %+v", snapHigh, highest, f)
			}
		default:
			t.Errorf("unexpected finding after the bumped restore: %+v", f)
		}
	}
}
