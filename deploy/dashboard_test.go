package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const dashboardFile = "grafana/payouts.json"

type dashPanel struct {
	ID      int         `json:"id"`
	Type    string      `json:"type"`
	Title   string      `json:"title"`
	Targets []dashQuery `json:"targets"`
	Panels  []dashPanel `json:"panels"`
}

type dashQuery struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// grafanaVars are the dashboard's built-in interval variables and what a
// query parser should see in their place.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// TestDashboardQueries checks every query of the Grafana dashboard parses
// as PromQL (promtool parses them as recording rules) and names only
// metrics some role exports, and that the dashboard draws what an operator
// needs.
func TestDashboardQueries(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string      `json:"uid"`
		Title  string      `json:"title"`
		Panels []dashPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard needs a uid and a title")
	}
	exported := exportedMetrics(t)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	var all []string
	ids := map[int]string{}
	var walk func([]dashPanel)
	walk = func(panels []dashPanel) {
		for _, p := range panels {
			if other, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or shared with %q", p.Title, p.ID, other)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				expr := grafanaVars.Replace(q.Expr)
				if strings.Contains(expr, "$") {
					t.Errorf("panel %q query %s: unknown variable in %q", p.Title, q.RefID, q.Expr)
				}
				if bad := unknownMetrics(expr, exported); len(bad) > 0 {
					t.Errorf("panel %q query %s: metrics %v are exported by no role", p.Title, q.RefID, bad)
				}
				fmt.Fprintf(&rules, "      - record: dashboard:panel%d:%s\n        expr: %q\n", p.ID, q.RefID, expr)
				all = append(all, expr)
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)

	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool(t, "promtool"), "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("a dashboard query does not parse: %v\n%s", err, out)
	}

	joined := strings.Join(all, "\n")
	for what, needle := range map[string]string{
		"payouts by state":        "max by (state) (payouts_payment_payouts)",
		"payouts/s":               "payouts_executor_payouts_total",
		"p99 latency":             "histogram_quantile(0.99,",
		"fenced_out at guard 1":   "payouts_payment_fenced_out_total",
		"fenced_out at guard 2":   "payouts_proxy_fenced_out_total",
		"ambiguous payouts":       `payouts_payment_payouts{state="RAIL_AMBIGUOUS"}`,
		"ambiguous age":           "payouts_payment_oldest_ambiguous_age_seconds",
		"the resolution SLA":      "payouts_payment_resolution_sla_seconds",
		"ambiguous over the SLA":  `check="ambiguous_over_sla"`,
		"lock grants/s":           "payouts_lock_grants_total",
		"session expirations":     "payouts_lock_expired_sessions_total",
		"reconciler findings":     "payouts_reconcile_findings",
		"reconciler last success": "payouts_reconcile_last_success_timestamp_seconds",
		"roles up":                `up{job=~"payouts-.*"}`,
	} {
		if !strings.Contains(joined, needle) {
			t.Errorf("the dashboard does not show %s (no query with %s)", what, needle)
		}
	}
}
