package railproxy

import (
	"net/http"
	"slices"
	"testing"

	"github.com/payouts/payouts/railproxy/proxyclient"
)

// GET /submission-digests pages through every attempt ordered by payout id
// (byte order), then attempt id: a payout's FENCED attempts and its
// forwarded one come together, and a page boundary between them loses
// nothing.
func TestSubmissionDigestsPageByPayout(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-x", "acc-1"), fencingToken(5), holder(5)); err != nil {
		t.Fatal(err)
	}
	// A stale token on acc-1: recorded FENCED, never forwarded.
	if _, err := b.pc.Submit(ctx, sub("p-a", "acc-1"), fencingToken(3), holder(3)); err == nil {
		t.Fatal("a stale token was not fenced out")
	}
	for _, s := range []struct {
		payout string
		token  int
	}{{"p-a", 6}, {"p-B", 7}} {
		if _, err := b.pc.Submit(ctx, sub(s.payout, "acc-1"), fencingToken(s.token), holder(s.token)); err != nil {
			t.Fatal(err)
		}
	}
	type row struct {
		payout  string
		outcome proxyclient.Outcome
		token   int64
	}
	var got []row
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end: %v", got)
		}
		page, err := b.recon.SubmissionDigests(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Items {
			if d.AccountID != "acc-1" || d.Holder == "" || d.ID == 0 {
				t.Errorf("digest %+v does not carry the attempt", d)
			}
			out := d.Outcome
			if out != proxyclient.OutcomeFenced {
				out = "forwarded"
			}
			got = append(got, row{d.PayoutID, out, int64(d.FenceToken)})
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	want := []row{{"p-B", "forwarded", 7}, {"p-a", proxyclient.OutcomeFenced, 3}, {"p-a", "forwarded", 6}, {"p-x", "forwarded", 5}}
	if !slices.Equal(got, want) {
		t.Fatalf("digests %v, want %v", got, want)
	}
}

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
