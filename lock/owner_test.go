package lock_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
)

// TestSessionOwnership: a session belongs to the principal that opened it.
// Another principal (another executor, or an operator) that names it to
// acquire, keep alive, release or close gets 403 not_session_owner and
// changes nothing; the operator ends the lock only by revoke. The same
// holds on a second service instance that never saw the session opened.
func TestSessionOwnership(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		sys := setup(t, kind)
		other := startService(t, sys.store)
		ctx := testCtx(t)
		s, err := lockclient.Open(ctx, sys.svc.URL, "exec-1-worker", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		const key = "payout:owned"
		g, err := s.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		sid := s.ID()
		for _, url := range []string{sys.svc.URL, other.URL} {
			for _, tok := range []string{executor2Token, operatorToken} {
				calls := []struct{ method, path, body string }{
					{http.MethodPost, "/v1/locks/" + key + "/acquire", `{"session_id":"` + sid + `"}`},
					{http.MethodPost, "/v1/locks/payout:other/acquire", `{"session_id":"` + sid + `"}`},
					{http.MethodPost, "/v1/sessions/" + sid + "/keepalive", ``},
					{http.MethodPost, "/v1/locks/" + key + "/release", `{"session_id":"` + sid + `","token":` + g.Token.String() + `}`},
					{http.MethodDelete, "/v1/sessions/" + sid, ``},
				}
				for _, c := range calls {
					status, body := rawDo(t, c.method, url+c.path, tok, c.body)
					if status != http.StatusForbidden || !strings.Contains(body, `"code":"`+string(problem.NotSessionOwner)+`"`) {
						t.Errorf("%s %s by another principal: %d %s; want 403 not_session_owner", c.method, c.path, status, body)
					}
				}
			}
		}
		op, _ := lockclient.New(sys.svc.URL, lockclient.WithToken(operatorToken))
		if l, err := op.Lock(ctx, key); err != nil || !l.Held || l.Token != g.Token || l.SessionID != sid {
			t.Fatalf("refused calls changed the lock: %+v %v", l, err)
		}
		if l, err := op.Lock(ctx, "payout:other"); err != nil || l.Held {
			t.Fatalf("a refused acquire took a lock: %+v %v", l, err)
		}
		if info, err := op.SessionInfo(ctx, sid); err != nil || info.State == "CLOSED" || info.State == "EXPIRED" {
			t.Fatalf("refused calls ended the session: %+v %v", info, err)
		}
		// The owner keeps using its session, on either instance.
		if status, body := rawDo(t, http.MethodPost, other.URL+"/v1/sessions/"+sid+"/keepalive", executorToken, ``); status != http.StatusOK {
			t.Fatalf("owner's keepalive: %d %s", status, body)
		}
		if s.State() != lockclient.Healthy {
			t.Fatalf("owner's session is %s", s.State())
		}
		// The operator's way: revoke.
		rec, err := op.Revoke(ctx, key, "worker wedged")
		if err != nil || rec.Token != g.Token || *rec.EndReason != "revoked" {
			t.Fatalf("revoke: %+v %v", rec, err)
		}
	})
}
