package railproxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Only an executor submits: with another role's token a submission that
// would otherwise be paid is refused before anything is written, the
// high-water mark included (a reconciler token paid anyone, and could push
// an account's mark out of every executor's reach).
func TestOnlyExecutorsSubmit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	for name, bearer := range map[string]string{"reconciler": reconcilerBearer, "operator": operatorBearer, "proxy": proxyBearer} {
		c, err := proxyclient.New(b.url, bearer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Submit(ctx, sub("evil-"+name, "acc-1"), 9007199254740991, "x"); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s submitting: %v, want forbidden", name, err)
		}
	}
	if p, err := b.pc.List(ctx, "", 0); err != nil || len(p.Items) != 0 {
		t.Fatalf("submissions after refused callers: %+v %v", p, err)
	}
	if h, ok := b.highWater(t, "acc-1"); ok {
		t.Fatalf("a refused caller moved the high-water mark: %+v", h)
	}
	if pays, err := b.rail.SettlementReport(ctx); err != nil || len(pays) != 0 {
		t.Fatalf("a refused caller was paid: %+v %v", pays, err)
	}
	if _, err := b.pc.Submit(ctx, sub("p-ok", "acc-1"), 3, holder(1)); err != nil {
		t.Fatalf("the executor submitting: %v", err)
	}
	if _, err := b.pc.Lookup(ctx, "p-ok"); !problem.Has(err, problem.Forbidden) {
		t.Fatalf("the executor looking up: %v, want forbidden (reconciler and operator only)", err)
	}
}

// Path and query parameters are checked before they reach SQL: input that
// PostgreSQL cannot even hold (a NUL, invalid UTF-8) is a 4xx, never a 500.
func TestMalformedPathAndQueryAre4xx(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/submissions/%FF", http.StatusNotFound},
		{http.MethodGet, "/v1/submissions/a%00b", http.StatusNotFound},
		{http.MethodPost, "/v1/submissions/%FF/lookup", http.StatusNotFound},
		{http.MethodPost, "/v1/submissions/a%00b/lookup", http.StatusNotFound},
		{http.MethodGet, "/v1/high-water?after=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/high-water?after=%FF", http.StatusBadRequest},
		{http.MethodGet, "/v1/submissions?after=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/safety-events?after=%FF", http.StatusBadRequest},
	} {
		req, err := http.NewRequestWithContext(ctxFor(t), tc.method, b.url+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		bearer := executorBearer
		if strings.HasSuffix(tc.path, "/lookup") {
			bearer = reconcilerBearer
		}
		req.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
	}
	if strings.Contains(b.logs.String(), "22021") {
		t.Fatalf("malformed input reached PostgreSQL:\n%s", b.logs.String())
	}
}
