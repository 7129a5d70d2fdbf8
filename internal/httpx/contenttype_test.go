package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
)

// A request body declared as anything but JSON in UTF-8 is refused before
// it is read: application/json-seq, a look-alike such as
// application/jsonfoo, or JSON in another charset would be read as what it
// is not. No Content-Type at all is taken as JSON.
func TestContentTypeMustBeJSON(t *testing.T) {
	ts, writes := newTestServer(t)
	post := func(ct string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/echo", strings.NewReader(`{"name":"a","amount":1}`))
		req.Header.Set("Authorization", "Bearer "+execToken)
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, ct := range []string{"application/jsonfoo", "application/json-seq", "text/plain", "application/x-www-form-urlencoded",
		"application/json; charset=iso-8859-1", "application/json; profile=x"} {
		if code := post(ct); code != http.StatusBadRequest {
			t.Errorf("Content-Type %q: %d, want 400", ct, code)
		}
	}
	if *writes != 0 {
		t.Fatalf("%d refused requests reached the handler", *writes)
	}
	for _, ct := range []string{"", "application/json", "Application/JSON", "application/json; charset=utf-8", "application/json;charset=UTF-8"} {
		if code := post(ct); code != http.StatusOK {
			t.Errorf("Content-Type %q: %d, want 200", ct, code)
		}
	}
}

// A request that carries nothing (a lock keepalive, a proxy lookup) takes
// an empty body, or {}, held to every body's rules: the keepalive and the
// lookup answer the same bodies alike.
func TestDecodeEmpty(t *testing.T) {
	for _, c := range []struct {
		ct, body string
		ok       bool
	}{
		{"", "", true}, {"text/plain", "  \n", true}, {"", "{}", true}, {"application/json", " {} ", true},
		{"text/plain", "{}", false}, {"", "null", false}, {"", "[]", false}, {"", `{"ttl_ms":1}`, false}, {"", "{} {}", false},
	} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body))
		if c.ct != "" {
			req.Header.Set("Content-Type", c.ct)
		}
		err := httpx.DecodeEmpty(req)
		if (err == nil) != c.ok || (err != nil && !problem.Has(err, problem.InvalidRequest)) {
			t.Errorf("Content-Type %q, body %q: %v; want accepted %t (refused as invalid_request)", c.ct, c.body, err, c.ok)
		}
	}
}
