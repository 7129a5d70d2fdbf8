package railproxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestMetricsServedWhileUnresolvedCountsFail: when the count of
// unresolved submissions cannot be read (proxydb down, or here its table
// out of reach), /metrics still answers 200 with every other series, the
// fenced_out counter among them, lacks the two gauges and counts the
// failure. It answered 500 for the whole page, so the proxy looked down
// while only its database was.
func TestMetricsServedWhileUnresolvedCountsFail(t *testing.T) {
	b := setup(t, options{})
	conn, err := pgx.Connect(ctxFor(t), b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctxFor(t))
	scrape := func() (int, string) {
		t.Helper()
		resp, err := http.Get(b.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := scrape(); code != 200 || !strings.Contains(body, "payouts_proxy_submissions_without_outcome 0") ||
		!strings.Contains(body, "payouts_proxy_unresolved_scrape_errors_total 0") {
		t.Fatalf("healthy scrape: %d\n%s", code, body)
	}
	// Each safety event kind is there at 0 before the first event, so the
	// first one is an increase (PayoutsTokenRegression's proxy branch).
	for _, k := range []string{"fenced_out", "token_regression", "duplicate_attempt"} {
		if code, body := scrape(); code != 200 || !strings.Contains(body, `payouts_proxy_safety_events_total{kind="`+k+`"} 0`) {
			t.Fatalf("a fresh proxy does not export safety events of kind %s at 0:\n%s", k, body)
		}
	}
	// So is each submission outcome (PayoutsAmbiguousBurst counts TIMEOUTs).
	for _, o := range []string{"ACKED", "REJECTED", "TIMEOUT", "FENCED"} {
		if code, body := scrape(); code != 200 || !strings.Contains(body, `payouts_proxy_submissions_total{outcome="`+o+`"} 0`) {
			t.Fatalf("a fresh proxy does not export submissions with outcome %s at 0:\n%s", o, body)
		}
	}
	if _, err := conn.Exec(ctxFor(t), `ALTER TABLE rail_submission RENAME TO rail_submission_away`); err != nil {
		t.Fatal(err)
	}
	code, body := scrape()
	if _, err := conn.Exec(ctxFor(t), `ALTER TABLE rail_submission_away RENAME TO rail_submission`); err != nil {
		t.Fatal(err)
	}
	if code != 200 {
		t.Fatalf("/metrics answered %d while the count failed:\n%s", code, body)
	}
	if strings.Contains(body, "\npayouts_proxy_submissions_without_outcome ") || !strings.Contains(body, "payouts_proxy_unresolved_scrape_errors_total 1") ||
		!strings.Contains(body, "payouts_proxy_fenced_out_total") {
		t.Fatalf("scrape while the count failed: want the gauges absent, the failure counted and the rest served:\n%s", body)
	}
}
