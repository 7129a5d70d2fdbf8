package railproxy

import (
	"net/http"
	"testing"
)

// Malformed paging input is a 4xx, never a 5xx.
func TestSubmissionDigestsRefuseBadQuery(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, q := range []string{"limit=0", "limit=10001", "after=p-a", "after=p-a:x", "after=p-a:-1", "after=%20p:1", "all=true"} {
		req, err := http.NewRequestWithContext(ctxFor(t), http.MethodGet, b.url+"/v1/submission-digests?"+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+reconcilerBearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/submission-digests?%s: %d, want 400", q, resp.StatusCode)
		}
	}
}
