package reconcile_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	"github.com/payouts/payouts/reconcile"
)

// flakyLock stands in front of the stack's lock service and answers 503
// to every release while failing is set (a lock service restarting).
func (e *testBundle) flakyLock(t *testing.T) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	target, err := url.Parse(e.st.Ready.LockURL)
	if err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() && strings.HasSuffix(r.URL.Path, "/release") {
			w.Header().Set("Content-Type", problem.ContentType)
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"about:blank","title":"restarting","status":503,"code":"unavailable"}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &failing
}

func (e *testBundle) held(t *testing.T, key string) bool {
	t.Helper()
	c, err := lockclient.New(e.st.Ready.LockURL, lockclient.WithToken(e.st.Ready.Tokens.Operator))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctxT(t), key)
	if err != nil {
		t.Fatalf("lock %s: %v", key, err)
	}
	return l.Held
}

// TestLostReleaseIsRetriedByTheNextPass: a release the lock service did not
// answer is not forgotten. The reconciler's session lives on in continuous
// mode, so the key would stay held — every executor skipping the account —
// until the process ends; the next pass gives it back.
func TestLostReleaseIsRetriedByTheNextPass(t *testing.T) {
	e := setup(t)
	srv, failing := e.flakyLock(t)
	lock, err := reconcile.NewLockService(srv.URL, e.st.Ready.Tokens.Reconciler, "reconcile-release-test", 15*time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Close(context.Background()) })
	key := fencing.Key(e.newAccount(t, 100))
	lease, held, err := lock.Acquire(ctxT(t), key, 0)
	if err != nil || held {
		t.Fatalf("acquire %s: held=%v err=%v", key, held, err)
	}
	failing.Store(true)
	if err := lock.Release(ctxT(t), key, lease); err == nil {
		t.Fatal("the release went through the failing lock service")
	}
	if !e.held(t, key) {
		t.Fatal("the key is free although its release failed")
	}
	failing.Store(false)
	r := e.reconcilerWith(t, reconcile.Options{}, e.st.Ready.Tokens.Operator, func(reconcile.LockService) reconcile.LockService { return lock })
	pass(t, r)
	if e.held(t, key) {
		t.Fatalf("%s is still held by the reconciler's session after the next pass", key)
	}
}

// lateGrants is the lock service as a reconciler sees it when the store
// commits a grant after grants with higher tokens (PostgreSQL sequences
// are taken before commit): the first read of the log that should show
// the hidden token does not; every read after it does.
type lateGrants struct {
	reconcile.LockService
	hidden fencing.Token
	mu     sync.Mutex
	shown  bool
}

func (l *lateGrants) Grants(ctx context.Context, after fencing.Token, limit int) ([]reconcile.GrantRecord, fencing.Token, error) {
	items, next, err := l.LockService.Grants(ctx, after, limit)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shown || err != nil {
		return items, next, err
	}
	out := items[:0:0]
	for _, it := range items {
		if it.Token == l.hidden {
			l.shown = true // committed just after this page was read
			continue
		}
		out = append(out, it)
	}
	return out, next, nil
}

// TestGrantCommittedOutOfTokenOrderIsNoFinding: a grant read late is no
// "without grant" finding; the reconciler looks a missing token up on its
// own before it reports one.
func TestGrantCommittedOutOfTokenOrderIsNoFinding(t *testing.T) {
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 100))
	e.payOut(t, e.newPayout(t, e.newAccount(t, 10_000), 100)) // a higher token on another key
	late := &lateGrants{hidden: p.Token}
	r := e.reconcilerWith(t, reconcile.Options{}, e.st.Ready.Tokens.Operator, func(l reconcile.LockService) reconcile.LockService {
		late.LockService = l
		return late
	})
	rep := pass(t, r)
	if !late.shown {
		t.Fatal("the test did not hide the grant from the first read of the log")
	}
	mustNotFind(t, rep, reconcile.CheckLedgerWithoutGrant, map[string]any{"payout_id": p.ID})
	mustNotFind(t, rep, reconcile.CheckSubmissionWithoutGrant, map[string]any{"payout_id": p.ID})
}

// refuser answers every request with status, as a service that does not
// accept the caller's token.
func refuser(t *testing.T, status int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", problem.ContentType)
		w.WriteHeader(status)
		code := map[int]string{http.StatusUnauthorized: "unauthorized", http.StatusForbidden: "forbidden"}[status]
		fmt.Fprintf(w, `{"type":"about:blank","title":"refused","status":%d,"code":"%s"}`, status, code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestRefusedTokenExitsTwo: a refused token (401/403) is not "could not
// reach the service" for ever: once or continuous, the reconciler exits 2
// naming the service's URL and the role it needs.
func TestRefusedTokenExitsTwo(t *testing.T) {
	e := setup(t)
	r := e.st.Ready
	for _, tc := range []struct {
		name   string
		once   bool
		status int
	}{
		{"once, 401 from the proxy", true, http.StatusUnauthorized},
		{"continuous, 403 from the proxy", false, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := refuser(t, tc.status)
			cfg := reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: bad.URL, RailURL: r.RailURL,
				Token: r.Tokens.Reconciler, RailToken: r.Tokens.Reconciler, Once: tc.once, Interval: 100 * time.Millisecond, Listen: "127.0.0.1:0", Logger: testLogger(t)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			code, err := reconcile.Run(ctx, cfg)
			if ctx.Err() != nil {
				t.Fatal("the reconciler kept running with a refused token")
			}
			if code != reconcile.ExitCannotRun || err == nil || !strings.Contains(err.Error(), bad.URL) || !strings.Contains(err.Error(), `role "reconciler"`) {
				t.Fatalf("exit %d, %v; want exit 2 naming %s and the reconciler role", code, err, bad.URL)
			}
		})
	}
}
