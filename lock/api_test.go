package lock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

func forEachBackend(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			fn(t, kind)
		})
	}
}

// rawDo is rawRequest's status and body.
func rawDo(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	code, _, b := rawRequest(t, method, url, token, body)
	return code, b
}

// rawRequest sends one request with a JSON body (and the token, unless
// empty).
func rawRequest(t *testing.T, method, url, token, body string) (int, http.Header, string) {
	t.Helper()
	return typedRequest(t, method, url, token, "application/json", body)
}

// typedRequest is rawRequest with the body's Content-Type (none when "").
func typedRequest(t *testing.T, method, url, token, contentType, body string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// holderSession opens a session of owner "holder" with the executor's
// token, closed when the test ends.
func holderSession(t *testing.T, ctx context.Context, url string) *lockclient.Session {
	t.Helper()
	s, err := lockclient.Open(ctx, url, "holder", lockclient.WithToken(executorToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(ctx) })
	return s
}

func TestClientFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		a, err := lockclient.Open(ctx, svc.URL, "worker-a", lockclient.WithToken(executorToken), lockclient.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		b, err := lockclient.Open(ctx, svc.URL, "worker-b", lockclient.WithToken(executorToken), lockclient.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		key := fencing.Key("acc-1")
		g, err := a.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !g.Valid() || g.Holder() != fencing.Holder(a.ID()) || g.Owner != "worker-a" || g.Deadline.IsZero() || g.ServerExpiry.IsZero() {
			t.Fatalf("grant: %+v", g)
		}
		again, err := a.TryAcquire(ctx, key)
		if err != nil || again.Token != g.Token {
			t.Fatalf("re-acquire: %+v %v", again, err)
		}
		_, err = b.TryAcquire(ctx, key)
		if !errors.Is(err, lockclient.ErrLockHeld) {
			t.Fatalf("other session: want ErrLockHeld, got %v", err)
		}
		if err := b.Release(ctx, g2(b, g)); !errors.Is(err, lockclient.ErrNotHeld) {
			t.Fatalf("release by a non-holder: want ErrNotHeld, got %v", err)
		}
		// A waiting acquire is granted when the holder releases.
		got := make(chan *lockclient.Grant, 1)
		errc := make(chan error, 1)
		go func() {
			wg, err := b.Acquire(ctx, key, 30*time.Second)
			got <- wg
			errc <- err
		}()
		eventually(t, "the waiter to be counted", func() bool {
			l, err := a.Client().Lock(ctx, key)
			return err == nil && l.Waiters == 1
		})
		if err := a.Release(ctx, g); err != nil {
			t.Fatal(err)
		}
		if g.Valid() || g.Context().Err() == nil {
			t.Fatal("a released grant is still valid")
		}
		bg := <-got
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if bg.Token <= g.Token {
			t.Fatalf("waiter's token %d <= %d", bg.Token, g.Token)
		}
		hi, err := a.Client().HighToken(ctx)
		if err != nil || hi < bg.Token {
			t.Fatalf("high token %d < %d (%v)", hi, bg.Token, err)
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if bg.Valid() || b.State() != lockclient.Lost {
			t.Fatal("grant valid after close")
		}
		recs, err := a.Client().AllGrants(ctx, 0)
		// a's grant, the unrelated grant g2 made for b, and b's waited-for grant.
		if err != nil || len(recs) != 3 {
			t.Fatalf("grant log: %+v %v", recs, err)
		}
		if recs[0].Token != g.Token || *recs[0].EndReason != "released" || recs[0].Actor != "worker-a" {
			t.Fatalf("released grant: %+v", recs[0])
		}
		if recs[2].Token != bg.Token || *recs[2].EndReason != "released" || recs[2].Actor != "session closed" {
			t.Fatalf("grant ended by close: %+v", recs[2])
		}
	})
}

// g2 is g as if b held it: a release that names someone else's grant.
func g2(b *lockclient.Session, g *lockclient.Grant) *lockclient.Grant {
	fake, _ := b.TryAcquire(testCtxNoT(), "payout:unrelated-"+b.ID())
	fake.Key, fake.Token = g.Key, g.Token
	return fake
}

func testCtxNoT() context.Context { return context.Background() }

func TestAuth(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		code, _ := rawDo(t, http.MethodPost, svc.URL+"/v1/sessions", "", `{"owner":"x","ttl_ms":5000}`)
		if code != http.StatusUnauthorized {
			t.Fatalf("no token: %d", code)
		}
		s := holderSession(t, ctx, svc.URL)
		g, err := s.TryAcquire(ctx, "payout:acc-7")
		if err != nil {
			t.Fatal(err)
		}
		exec, _ := lockclient.New(svc.URL, lockclient.WithToken(executorToken))
		if _, err := exec.Revoke(ctx, "payout:acc-7", "because"); !problem.Has(err, problem.Forbidden) {
			t.Fatalf("executor revoke: want forbidden, got %v", err)
		}
		op, _ := lockclient.New(svc.URL, lockclient.WithToken(operatorToken))
		if _, err := op.Revoke(ctx, "payout:acc-7", ""); !problem.Has(err, problem.InvalidRequest) {
			t.Fatalf("revoke without reason: want invalid_request, got %v", err)
		}
		if l, _ := op.Lock(ctx, "payout:acc-7"); !l.Held || l.Token != g.Token {
			t.Fatalf("refused revokes changed the lock: %+v", l)
		}
		rec, err := op.Revoke(ctx, "payout:acc-7", "worker stuck")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Token != g.Token || *rec.EndReason != "revoked" || rec.Actor != "alice" || rec.Reason != "worker stuck" {
			t.Fatalf("revoke record: %+v", rec)
		}
		if err := s.Release(ctx, g); !errors.Is(err, lockclient.ErrNotHeld) {
			t.Fatalf("release after revoke: want not_held, got %v", err)
		}
		g3, err := s.TryAcquire(ctx, "payout:acc-7")
		if err != nil || g3.Token <= g.Token {
			t.Fatalf("acquire after revoke: %+v %v", g3, err)
		}
	})
}

func TestBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s := holderSession(t, ctx, svc.URL)
		sid := s.ID()
		cases := []struct {
			name, path, body string
			status           int
			code             problem.Code
			mention          string
			field            string // the problem's field member ("": none)
		}{
			{"ttl zero", "/v1/sessions", `{"owner":"x","ttl_ms":0}`, 400, problem.InvalidRequest, "ttl_ms", "ttl_ms"},
			{"ttl negative", "/v1/sessions", `{"owner":"x","ttl_ms":-5}`, 400, problem.InvalidRequest, "ttl_ms", "ttl_ms"},
			{"ttl absurd", "/v1/sessions", `{"owner":"x","ttl_ms":86400000}`, 400, problem.InvalidRequest, "ttl_ms", "ttl_ms"},
			{"ttl string", "/v1/sessions", `{"owner":"x","ttl_ms":"5000"}`, 400, problem.InvalidRequest, "ttl_ms", "ttl_ms"},
			{"no owner", "/v1/sessions", `{"ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"unknown field", "/v1/sessions", `{"owner":"x","ttl_ms":5000,"colour":"red"}`, 400, problem.InvalidRequest, "colour", "colour"},
			{"not json", "/v1/sessions", `owner=x`, 400, problem.InvalidRequest, "JSON", ""},
			{"unknown session keepalive", "/v1/sessions/999999/keepalive", ``, 404, problem.SessionExpired, "999999", ""},
			{"malformed session keepalive", "/v1/sessions/a%20b/keepalive", ``, 400, problem.InvalidRequest, "session_id", "session_id"},
			{"malformed key", "/v1/locks/%20bad/acquire", `{"session_id":"` + sid + `"}`, 400, problem.InvalidRequest, "key", "key"},
			{"key too long", "/v1/locks/" + strings.Repeat("k", 300) + "/acquire", `{"session_id":"` + sid + `"}`, 400, problem.InvalidRequest, "key", "key"},
			{"no session", "/v1/locks/payout:a/acquire", `{}`, 400, problem.InvalidRequest, "session_id", "session_id"},
			{"unknown session acquire", "/v1/locks/payout:a/acquire", `{"session_id":"12345"}`, 404, problem.SessionExpired, "12345", ""},
			{"negative wait", "/v1/locks/payout:a/acquire", `{"session_id":"` + sid + `","wait_ms":-1}`, 400, problem.InvalidRequest, "wait_ms", "wait_ms"},
			{"absurd wait", "/v1/locks/payout:a/acquire", `{"session_id":"` + sid + `","wait_ms":999999999}`, 400, problem.InvalidRequest, "wait_ms", "wait_ms"},
			{"token string", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","token":"7"}`, 400, problem.InvalidRequest, "token", "token"},
			{"token float", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","token":1.5}`, 400, problem.InvalidRequest, "token", "token"},
			{"token zero", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","token":0}`, 400, problem.InvalidRequest, "token", "token"},
			{"token huge", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","token":9007199254740993}`, 400, problem.InvalidRequest, "token", "token"},
			{"release free key", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","token":5}`, 409, problem.NotHeld, "payout:a", ""},
			// Values that wrapped around when converted to a duration.
			{"ttl wraps", "/v1/sessions", `{"owner":"x","ttl_ms":288230376151771744}`, 400, problem.InvalidRequest, "ttl_ms", "ttl_ms"},
			{"wait wraps", "/v1/locks/payout:a/acquire", `{"session_id":"` + sid + `","wait_ms":288230376151771744}`, 400, problem.InvalidRequest, "wait_ms", "wait_ms"},
			// Field names match exactly, never case-insensitively.
			{"owner capitalised", "/v1/sessions", `{"Owner":"x","ttl_ms":5000}`, 400, problem.InvalidRequest, "Owner", "Owner"},
			{"ttl capitalised", "/v1/sessions", `{"owner":"x","TTL_MS":5000}`, 400, problem.InvalidRequest, "TTL_MS", "TTL_MS"},
			{"session id capitalised", "/v1/locks/payout:a/acquire", `{"Session_ID":"` + sid + `"}`, 400, problem.InvalidRequest, "Session_ID", "Session_ID"},
			{"token capitalised", "/v1/locks/payout:a/release", `{"session_id":"` + sid + `","TOKEN":5}`, 400, problem.InvalidRequest, "TOKEN", "TOKEN"},
			// A keepalive carries nothing: empty or {}.
			{"keepalive garbage", "/v1/sessions/" + sid + "/keepalive", `garbage`, 400, problem.InvalidRequest, "{}", ""},
			{"keepalive null", "/v1/sessions/" + sid + "/keepalive", `null`, 400, problem.InvalidRequest, "{}", ""},
			{"keepalive member", "/v1/sessions/" + sid + "/keepalive", `{"ttl_ms":60000}`, 400, problem.InvalidRequest, "{}", "ttl_ms"},
			{"owner blank", "/v1/sessions", `{"owner":"","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner too long", "/v1/sessions", `{"owner":"` + strings.Repeat("o", 300) + `","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner control character", "/v1/sessions", `{"owner":"a\u0001b","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner C1 control", "/v1/sessions", `{"owner":"exec\u0085x","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner bidi override", "/v1/sessions", `{"owner":"\u202eevil","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner lone surrogate", "/v1/sessions", `{"owner":"a\ud800","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"owner spaces only", "/v1/sessions", `{"owner":"   ","ttl_ms":5000}`, 400, problem.InvalidRequest, "owner", "owner"},
			{"malformed session in body", "/v1/locks/payout:a/acquire", `{"session_id":"a b"}`, 400, problem.InvalidRequest, "session_id", "session_id"},
			{"no session release", "/v1/locks/payout:a/release", `{"token":5}`, 400, problem.InvalidRequest, "session_id", "session_id"},
			{"malformed key release", "/v1/locks/%20bad/release", `{"session_id":"` + sid + `","token":5}`, 400, problem.InvalidRequest, "key", "key"},
		}
		for _, tc := range cases {
			status, body := rawDo(t, http.MethodPost, svc.URL+tc.path, executorToken, tc.body)
			if status != tc.status || !strings.Contains(body, `"code":"`+string(tc.code)+`"`) || !strings.Contains(body, tc.mention) {
				t.Errorf("%s: got %d %s; want %d %s mentioning %q", tc.name, status, body, tc.status, tc.code, tc.mention)
			}
			if got := problemField(body); got != tc.field {
				t.Errorf("%s: field %q in %s; want %q", tc.name, got, body, tc.field)
			}
		}
		// Reads and the operator's revoke name the field they refuse too:
		// the path's {key} as key, its session {id} as session_id.
		for _, tc := range []struct{ name, method, path, token, body, field string }{
			{"revoke without reason", http.MethodPost, "/v1/locks/payout:a/revoke", operatorToken, `{}`, "reason"},
			{"revoke with a blank reason", http.MethodPost, "/v1/locks/payout:a/revoke", operatorToken, `{"reason":""}`, "reason"},
			{"revoke with a long reason", http.MethodPost, "/v1/locks/payout:a/revoke", operatorToken, `{"reason":"` + strings.Repeat("r", 5000) + `"}`, "reason"},
			{"revoke of a malformed key", http.MethodPost, "/v1/locks/%20bad/revoke", operatorToken, `{"reason":"x"}`, "key"},
			{"revoke with an unknown field", http.MethodPost, "/v1/locks/payout:a/revoke", operatorToken, `{"reason":"x","actor":"bob"}`, "actor"},
			{"read of a malformed key", http.MethodGet, "/v1/locks/%20bad", executorToken, ``, "key"},
			{"read of a malformed session", http.MethodGet, "/v1/sessions/a%20b", executorToken, ``, "session_id"},
			{"close of a malformed session", http.MethodDelete, "/v1/sessions/a%20b", executorToken, ``, "session_id"},
			{"list with a malformed prefix", http.MethodGet, "/v1/locks?prefix=%20p", executorToken, ``, "prefix"},
			{"list with limit 0", http.MethodGet, "/v1/locks?limit=0", executorToken, ``, "limit"},
			{"grants after a negative token", http.MethodGet, "/v1/grants?after_token=-1", executorToken, ``, "after_token"},
			{"grants with a limit over 1000", http.MethodGet, "/v1/grants?limit=1001", executorToken, ``, "limit"},
		} {
			status, body := rawDo(t, tc.method, svc.URL+tc.path, tc.token, tc.body)
			if status != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_request"`) || problemField(body) != tc.field {
				t.Errorf("%s: got %d %s; want 400 invalid_request with field %q", tc.name, status, body, tc.field)
			}
		}
		if status, body := rawDo(t, http.MethodPost, svc.URL+"/v1/locks/payout:a/revoke", operatorToken, `{"Reason":"x"}`); status != 400 || !strings.Contains(body, "Reason") {
			t.Errorf("revoke with a capitalised field: %d %s; want 400", status, body)
		}
		// A body of unknown length (chunked) is read and judged too.
		req, _ := http.NewRequest(http.MethodPost, svc.URL+"/v1/sessions/"+sid+"/keepalive", io.MultiReader(strings.NewReader("garbage")))
		req.Header.Set("Authorization", "Bearer "+executorToken)
		resp, err := httpClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("chunked garbage keepalive: %d; want 400", resp.StatusCode)
		}
		for _, body := range []string{"", "{}", " { } "} {
			if status, out := rawDo(t, http.MethodPost, svc.URL+"/v1/sessions/"+sid+"/keepalive", executorToken, body); status != http.StatusOK {
				t.Errorf("keepalive with body %q: %d %s; want 200", body, status, out)
			}
		}
		cl := s.Client()
		if recs, err := cl.AllGrants(ctx, 0); err != nil || len(recs) != 0 {
			t.Fatalf("bad input wrote grants: %+v %v", recs, err)
		}
		if locks, err := cl.Locks(ctx, ""); err != nil || len(locks) != 0 {
			t.Fatalf("bad input took locks: %+v %v", locks, err)
		}
		if hi, err := cl.HighToken(ctx); err != nil || hi != 0 {
			t.Fatalf("bad input minted tokens: %d %v", hi, err)
		}
	})
}

// TestKeepaliveContentType: a keepalive's body is held to the rule of every
// other body: its Content-Type, when given, is application/json (charset
// utf-8, if any), or the keepalive is 400 invalid_request. An empty body
// has nothing for a Content-Type to describe (as the proxy's lookup, whose
// body is also empty or {}: httpx.DecodeEmpty). Before, the keepalive read
// its body without looking at the Content-Type and answered 200 to {} sent
// as text/plain.
func TestKeepaliveContentType(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s := holderSession(t, ctx, svc.URL)
		url := svc.URL + "/v1/sessions/" + s.ID() + "/keepalive"
		for _, tc := range []struct {
			contentType, body string
			status            int
		}{
			{"text/plain", `{}`, http.StatusBadRequest},
			{"application/x-www-form-urlencoded", `{}`, http.StatusBadRequest},
			{"application/json; charset=latin1", `{}`, http.StatusBadRequest},
			{"text/plain", `{"ttl_ms":60000}`, http.StatusBadRequest},
			{"application/json", `{}`, http.StatusOK},
			{"application/json; charset=utf-8", ` {} `, http.StatusOK},
			{"", `{}`, http.StatusOK},
			{"", ``, http.StatusOK},
			{"application/json", ``, http.StatusOK},
			{"text/plain", ``, http.StatusOK},
		} {
			status, _, body := typedRequest(t, http.MethodPost, url, executorToken, tc.contentType, tc.body)
			if status != tc.status {
				t.Errorf("keepalive with Content-Type %q and body %q: %d %s; want %d", tc.contentType, tc.body, status, body, tc.status)
				continue
			}
			if tc.status == http.StatusBadRequest && tc.body == `{}` &&
				(!strings.Contains(body, `"code":"invalid_request"`) || !strings.Contains(body, "Content-Type")) {
				t.Errorf("keepalive with Content-Type %q and body {}: %s; want invalid_request naming the Content-Type", tc.contentType, body)
			}
		}
	})
}

// TestCloseSessionBody: DELETE /v1/sessions/{id} holds its body to the
// keepalive's rule (empty or {}, a Content-Type when given
// application/json): a body it would ignore is refused 400 and the session
// and its locks stay. Before, any body closed the session and released
// its locks.
func TestCloseSessionBody(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s := holderSession(t, ctx, svc.URL)
		if _, err := s.Acquire(ctx, "payout:acc-close", 0); err != nil {
			t.Fatal(err)
		}
		del := func(contentType, body string) (int, string) {
			status, _, b := typedRequest(t, http.MethodDelete, svc.URL+"/v1/sessions/"+s.ID(), executorToken, contentType, body)
			return status, b
		}
		for _, tc := range []struct{ contentType, body string }{
			{"text/plain", "garbage"}, {"application/json", "garbage"}, {"application/x-www-form-urlencoded", "a=b"},
			{"application/json", `{"x":1}`}, {"text/plain", `{}`},
		} {
			if status, body := del(tc.contentType, tc.body); status != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_request"`) {
				t.Errorf("DELETE with Content-Type %q and body %q: %d %s; want 400 invalid_request", tc.contentType, tc.body, status, body)
			}
		}
		if info, err := s.Client().Lock(ctx, "payout:acc-close"); err != nil || !info.Held {
			t.Fatalf("after refused closes the lock is %+v %v; want it still held", info, err)
		}
		if status, body := del("application/json", `{}`); status != http.StatusOK || !strings.Contains(body, `"CLOSED"`) {
			t.Fatalf("DELETE with {}: %d %s; want 200 CLOSED", status, body)
		}
	})
}

// problemField is the field member of a problem body ("" when it has none).
func problemField(body string) string {
	var p struct {
		Field string `json:"field"`
	}
	_ = json.Unmarshal([]byte(body), &p)
	return p.Field
}

// TestEscapedKeyIsTheKey: a key sent percent-escaped (payout%3Aacc-1, as
// encodeURIComponent sends payout:acc-1) is the same key: the grant names
// it unescaped, a read of the plain path sees it held, and the release by
// either spelling ends it.
func TestEscapedKeyIsTheKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s := holderSession(t, ctx, svc.URL)
		status, body := rawDo(t, http.MethodPost, svc.URL+"/v1/locks/payout%3Aesc-1/acquire", executorToken, `{"session_id":"`+s.ID()+`"}`)
		if status != http.StatusOK || !strings.Contains(body, `"key":"payout:esc-1"`) {
			t.Fatalf("acquire of payout%%3Aesc-1: %d %s; want 200 naming payout:esc-1", status, body)
		}
		var g struct {
			Token int64 `json:"token"`
		}
		if err := json.Unmarshal([]byte(body), &g); err != nil || g.Token <= 0 {
			t.Fatalf("grant %s: %v", body, err)
		}
		l, err := s.Client().Lock(ctx, "payout:esc-1")
		if err != nil || !l.Held || int64(l.Token) != g.Token {
			t.Fatalf("payout:esc-1 after the escaped acquire: %+v, %v; want held under token %d", l, err, g.Token)
		}
		status, body = rawDo(t, http.MethodPost, svc.URL+"/v1/locks/payout%3aesc-1/release", executorToken,
			fmt.Sprintf(`{"session_id":"%s","token":%d}`, s.ID(), g.Token))
		if status != http.StatusOK {
			t.Fatalf("release of payout%%3aesc-1: %d %s", status, body)
		}
		if l, err := s.Client().Lock(ctx, "payout:esc-1"); err != nil || l.Held {
			t.Fatalf("payout:esc-1 after the escaped release: %+v, %v; want free", l, err)
		}
	})
}

// TestSessionShapeAfterEnd: GET /v1/sessions/{id} answers every member
// DESIGN §4 names, for a closed session too (a time the backend no longer
// knows is null, not left out).
func TestSessionShapeAfterEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		s, err := lockclient.Open(ctx, svc.URL, "shape", lockclient.WithToken(executorToken))
		if err != nil {
			t.Fatal(err)
		}
		id := s.ID()
		get := func() map[string]any {
			t.Helper()
			req, _ := http.NewRequest(http.MethodGet, svc.URL+"/v1/sessions/"+id, nil)
			req.Header.Set("Authorization", "Bearer "+executorToken)
			resp, err := httpClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var m map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET session: %d %v", resp.StatusCode, err)
			}
			return m
		}
		for _, when := range []string{"open", "closed"} {
			if when == "closed" {
				if err := s.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			m := get()
			for _, k := range []string{"session_id", "owner", "ttl_ms", "state", "last_heartbeat_at", "expires_at"} {
				if _, ok := m[k]; !ok {
					t.Errorf("%s session: no %q in %v", when, k, m)
				}
			}
			if want := map[string]string{"open": "ACTIVE", "closed": "CLOSED"}[when]; m["state"] != want {
				t.Errorf("%s session: state %v, want %s", when, m["state"], want)
			}
		}
	})
}

// TestUnroutedAndOversizeAndNULAnswers: an unknown path is 404 and a
// method a path lacks 405 with Allow, with or without a token (the role
// check sits behind routing); a keepalive body over 1 MiB is 413 however
// much of it is whitespace; a revoke reason with a NUL is 400 on the
// reason, not a 500 from the store.
func TestUnroutedAndOversizeAndNULAnswers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		svc := setup(t, kind).svc
		ctx := testCtx(t)
		do := func(method, path, token, body string) (int, http.Header, string) {
			t.Helper()
			return rawRequest(t, method, svc.URL+path, token, body)
		}
		for _, token := range []string{"", executorToken} {
			if code, _, body := do(http.MethodGet, "/v1/nowhere", token, ""); code != http.StatusNotFound {
				t.Errorf("GET /v1/nowhere (token %t): %d %s, want 404", token != "", code, body)
			}
			if code, h, body := do(http.MethodDelete, "/v1/sessions", token, ""); code != http.StatusMethodNotAllowed || h.Get("Allow") != "POST" {
				t.Errorf("DELETE /v1/sessions (token %t): %d Allow=%q %s, want 405 Allow=POST", token != "", code, h.Get("Allow"), body)
			}
		}
		s := holderSession(t, ctx, svc.URL)
		if code, _, body := do(http.MethodPost, "/v1/sessions/"+s.ID()+"/keepalive", executorToken, "{}"+strings.Repeat(" ", httpx.MaxBodyBytes)); code != http.StatusRequestEntityTooLarge {
			t.Errorf("keepalive with a body 2 bytes over the limit: %d %s, want 413", code, body)
		}
		if _, err := s.TryAcquire(ctx, "payout:nul"); err != nil {
			t.Fatal(err)
		}
		code, _, body := do(http.MethodPost, "/v1/locks/payout:nul/revoke", operatorToken, `{"reason":"a\u0000b"}`)
		if code != http.StatusBadRequest || !strings.Contains(body, `"field":"reason"`) {
			t.Errorf("revoke with a NUL in its reason: %d %s, want 400 on reason", code, body)
		}
	})
}
