package rail

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
)

// GET /settlement-report?after=&limit= pages through the payments in
// client-reference order (byte order), a reference's payments together and
// in the order accepted, references first seen between two pages
// included; without parameters it is still every payment in the order
// accepted (DESIGN §4).
func TestSettlementReportPagesByClientReference(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	ctx := ctxFor(t)
	paid := []string{"ref-c", "ref-a", "ref-B", "ref-c", "ref-a"}
	var order []string
	for _, ref := range paid {
		p, err := b.px.Pay(ctx, req(ref))
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, p.RailRef)
	}
	whole, err := b.op.SettlementReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wholeRefs []string
	for _, p := range whole {
		wholeRefs = append(wholeRefs, p.RailRef)
	}
	if !slices.Equal(wholeRefs, order) {
		t.Fatalf("the unpaged report lists %v, want every payment in the order accepted %v", wholeRefs, order)
	}

	type item struct{ ref, rail string }
	var got []item
	after := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("paging does not end: %v", got)
		}
		page, err := b.op.SettlementReportPage(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page.Items {
			got = append(got, item{p.ClientRef, p.RailRef})
		}
		if pages == 0 {
			// A reference first seen after the first page, sorting after it.
			p, err := b.px.Pay(ctx, req("ref-d"))
			if err != nil {
				t.Fatal(err)
			}
			order = append(order, p.RailRef)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	want := []item{{"ref-B", order[2]}, {"ref-a", order[1]}, {"ref-a", order[4]}, {"ref-c", order[0]}, {"ref-c", order[3]}, {"ref-d", order[5]}}
	if !slices.Equal(got, want) {
		t.Fatalf("paged report %v, want %v", got, want)
	}
	if _, err := b.rc.SettlementReportPage(ctx, "", 10); !problem.Has(err, problem.Forbidden) {
		t.Errorf("the reconciler role reading the report: %v, want forbidden", err)
	}
}

// Malformed paging input is a 4xx, never a 5xx.
func TestSettlementReportRefusesBadQuery(t *testing.T) {
	t.Parallel()
	b := setup(t, time.Minute)
	for _, q := range []string{"limit=0", "limit=10001", "limit=x", "after=a%0Ab", "client_ref=x"} {
		r, err := http.NewRequestWithContext(ctxFor(t), http.MethodGet, b.op.BaseURL()+"/v1/settlement-report?"+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Authorization", "Bearer "+operatorToken)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/settlement-report?%s: %d, want 400", q, resp.StatusCode)
		}
	}
}
