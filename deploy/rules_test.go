package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

const (
	alertsFile     = "prometheus/alerts.yml"
	alertsTestFile = "prometheus/alerts_test.yml"
	runbookBase    = "https://github.com/payouts/payouts/blob/main/docs/operations.md#"
)

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestRulesPromtool validates the alert rules and runs their unit tests.
func TestRulesPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertsTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestRulesShape holds every alert to what an operator needs (a severity, a
// summary, a runbook section that exists), every metric it names to one
// some role exports, and every alert to unit tests that see it both fire
// and stay quiet.
func TestRulesShape(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc ruleFile
	if err := yaml.UnmarshalStrict(raw, &doc); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	ops, err := os.ReadFile(filepath.Join(moduleRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	fires, quiet := alertTestCoverage(t)
	exported := exportedMetrics(t)
	seen := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is not an alert (%q)", g.Name, r.Expr)
				continue
			}
			seen[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "page" && sev != "ticket" {
				t.Errorf("%s: severity %q, want page or ticket", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
			if want := runbookBase + r.Alert; r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !strings.Contains(string(ops), `<a id="`+r.Alert+`"></a>`) {
				t.Errorf("%s: docs/operations.md has no runbook section (anchor %q)", r.Alert, r.Alert)
			}
			if bad := unknownMetrics(r.Expr, exported); len(bad) > 0 {
				t.Errorf("%s: metrics %v are exported by no role", r.Alert, bad)
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: %s must test it firing (%v) and staying quiet (%v)", r.Alert, alertsTestFile, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	for _, want := range []string{"PayoutsFencedOut", "PayoutsTokenRegression", "PayoutsDuplicateAttempt",
		"PayoutsRejectedTransition", "PayoutsLedgerDrift", "PayoutsAmbiguousOverSLA", "PayoutsReconcileFindings",
		"PayoutsReconcileNotSucceeding", "PayoutsLockSessionExpirations", "PayoutsRoleDown"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
	if !strings.Contains(string(raw), "absent(payouts_reconcile_last_success_timestamp_seconds)") {
		t.Error("a reconciler that never ran must page: PayoutsReconcileNotSucceeding needs absent(payouts_reconcile_last_success_timestamp_seconds)")
	}
}

// alertTestCoverage reads the unit tests: which alerts some test expects to
// fire, and which some test expects to stay quiet.
func alertTestCoverage(t *testing.T) (fires, quiet map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile(alertsTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", alertsTestFile, err)
	}
	fires, quiet = map[string]bool{}, map[string]bool{}
	for _, tc := range doc.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	return fires, quiet
}
