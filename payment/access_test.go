package payment

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Path and query parameters are checked before they reach SQL: input that
// PostgreSQL cannot even hold (a NUL, invalid UTF-8) is a 4xx, never a 500.
func TestMalformedPathAndQueryAre4xx(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/v1/payouts/%FF", http.StatusNotFound},
		{http.MethodGet, "/v1/payouts/a%00b", http.StatusNotFound},
		{http.MethodGet, "/v1/payouts/%FF/events", http.StatusNotFound},
		{http.MethodPost, "/v1/payouts/%FF/claim", http.StatusNotFound},
		{http.MethodGet, "/v1/accounts/a%00b", http.StatusNotFound},
		{http.MethodGet, "/v1/accounts/%FF/ledger-sum", http.StatusNotFound},
		{http.MethodGet, "/v1/accounts?after=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/payouts?after=%FF", http.StatusBadRequest},
		{http.MethodGet, "/v1/payouts?account_id=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/payouts?state=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/ledger?after=%00", http.StatusBadRequest},
		{http.MethodGet, "/v1/safety-events?after=%FF", http.StatusBadRequest},
		{http.MethodGet, "/v1/work?limit=%00", http.StatusBadRequest},
	} {
		req, err := http.NewRequestWithContext(tctx(t), tc.method, e.url+tc.path, strings.NewReader(`{"token":1,"holder":"h"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+executorBearer)
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
	if strings.Contains(e.logs.String(), "22021") {
		t.Fatalf("malformed input reached PostgreSQL:\n%s", e.logs.String())
	}
}
