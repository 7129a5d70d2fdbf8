package lock_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/fuzzhttp"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
)

// lockState is what a rejected request must leave as it was: how many
// sessions, grants and held locks there are, how many grants ended, and the
// fixture session's heartbeat and state.
type lockState struct {
	sessions, grants, ended, entries int64
	heartbeat                        time.Time
	state                            string
}

// FuzzLockRequests sends malformed and valid bodies to every lock service
// endpoint that decodes one (sessions, acquire, release, revoke,
// keepalive). "SID" in the path or body stands for a live session's id, so
// the fuzzer reaches past session lookup. Every answer is a 2xx or a 4xx
// problem; a 4xx changes nothing in lockdb.
func FuzzLockRequests(f *testing.F) {
	sys := setup(f, "postgres")
	st, svc := sys.store, sys.svc
	ctx := testCtx(f)
	// The fixture session is made by hand, not with lockclient.Session,
	// whose keepalives would move its heartbeat while inputs run.
	a := fuzzhttp.Do(f, http.MethodPost, svc.URL+"/v1/sessions", executorToken, []byte(`{"owner":"fuzz-fixture","ttl_ms":300000}`))
	var sess lockclient.SessionInfo
	if err := json.Unmarshal(a.Body, &sess); err != nil || !a.OK() {
		f.Fatalf("create the fixture session: %d %s (%v)", a.Status, a.Body, err)
	}
	sid := sess.SessionID
	acquireFixture := func(t testing.TB) {
		a := fuzzhttp.Do(t, http.MethodPost, svc.URL+"/v1/locks/payout:fz-held/acquire", executorToken, []byte(`{"session_id":"`+sid+`"}`))
		if !a.OK() && a.Code != problem.LockHeld {
			t.Fatalf("acquire the fixture lock: %d %s", a.Status, a.Body)
		}
	}
	acquireFixture(f)
	conn := pgtest.Conn(f, st.url)
	snapshot := func(t testing.TB) lockState {
		var s lockState
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM lock_session), (SELECT count(*) FROM lock_grant),
			(SELECT count(*) FROM lock_grant WHERE ended_at IS NOT NULL), (SELECT count(*) FROM lock_entry),
			last_heartbeat_at, state FROM lock_session WHERE id = $1`, sid).
			Scan(&s.sessions, &s.grants, &s.ended, &s.entries, &s.heartbeat, &s.state); err != nil {
			t.Fatalf("read lockdb: %v", err)
		}
		return s
	}

	type op struct {
		method, path string // path: %s is the (escaped) path argument
		token        string
	}
	ops := []op{
		{http.MethodPost, "/v1/sessions", executorToken},
		{http.MethodPost, "/v1/locks/%s/acquire", executorToken},
		{http.MethodPost, "/v1/locks/%s/release", executorToken},
		{http.MethodPost, "/v1/locks/%s/revoke", operatorToken},
		{http.MethodPost, "/v1/sessions/%s/keepalive", executorToken},
	}
	seeds := []struct {
		op        int
		arg, body string
	}{
		{0, "", `{"owner":"exec-1","ttl_ms":10000}`},
		{0, "", `{"owner":"exec-1","ttl_ms":999}`},
		{0, "", `{"owner":"exec-1","ttl_ms":300001}`},
		{0, "", `{"owner":"","ttl_ms":10000}`},
		{0, "", `{"owner":"exec-1","ttl_ms":"10s"}`},
		{0, "", `{"owner":"exec-1","ttl_ms":10000,"extra":true}`},
		{0, "", `{"owner":"\u0000","ttl_ms":1e4}`},
		{0, "", `{"owner":"exec-1"} {"owner":"x"}`},
		{1, "payout:fz-1", `{"session_id":"SID"}`},
		{1, "payout:fz-held", `{"session_id":"SID","wait_ms":0}`},
		{1, "payout:fz-1", `{"session_id":"SID","wait_ms":-1}`},
		{1, "payout:fz-1", `{"session_id":"SID","wait_ms":300001}`},
		{1, "payout:fz-1", `{"session_id":"no-such-session"}`},
		{1, "payout:fz-1", `{"session_id":""}`},
		{1, "", `{"session_id":"SID"}`},
		{1, strings.Repeat("k", 300), `{"session_id":"SID"}`},
		{1, "payout:fz-1", `{"session_id":"SID","token":1}`},
		{2, "payout:fz-held", `{"session_id":"SID","token":1}`},
		{2, "payout:fz-held", `{"session_id":"SID","token":0}`},
		{2, "payout:fz-held", `{"session_id":"SID","token":9007199254740992}`},
		{2, "payout:fz-held", `{"session_id":"SID","token":-5}`},
		{2, "payout:fz-held", `{"session_id":"SID","token":1.5}`},
		{2, "payout:fz-none", `{"session_id":"SID","token":3}`},
		{2, "payout:fz-held", `{"session_id":"SID"}`},
		{3, "payout:fz-held", `{"reason":"worker wedged"}`},
		{3, "payout:fz-held", `{"reason":""}`},
		{3, "payout:fz-held", `{"reason":"` + strings.Repeat("r", 1001) + `"}`},
		{3, "payout:fz-none", `{"reason":"nothing held"}`},
		{3, "payout:fz-held", `{}`},
		{4, "SID", ``},
		{4, "SID", `{}`},
		{4, "SID", `{"ttl_ms":1}`},
		{4, "SID", `[]`},
		{4, "no-such-session", `{}`},
		{4, "", `{}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.op), s.arg, []byte(s.body))
	}
	for _, body := range []string{``, `null`, `[]`, `{`, `"x"`, `{"a":1}`, `{"session_id":1}`, "\xff\xfe", `{"owner":"a","ttl_ms":10000}`} {
		for i := range ops {
			f.Add(uint8(i), "payout:fz-held", []byte(body))
		}
	}

	f.Fuzz(func(t *testing.T, opIdx uint8, arg string, body []byte) {
		o := ops[int(opIdx)%len(ops)]
		arg = strings.ReplaceAll(arg, "SID", sid)
		body = bytes.ReplaceAll(body, []byte("SID"), []byte(sid))
		path := o.path
		path = strings.Replace(path, "%s", url.PathEscape(arg), 1)
		before := snapshot(t)
		a := fuzzhttp.Do(t, o.method, svc.URL+path, o.token, body)
		if a.OK() {
			// Undo what a revoke or release did to the fixture's lock, so
			// later inputs still find it held.
			acquireFixture(t)
			return
		}
		if after := snapshot(t); after != before {
			t.Fatalf("%s %s with body %q was refused (%d %s) but changed lockdb: %+v -> %+v", o.method, path, body, a.Status, a.Code, before, after)
		}
	})
}
