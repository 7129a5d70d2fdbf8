package reconcile_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

const alertsFile = "../docs/alerts.yml"

// TestAlertRulesPromtool validates docs/alerts.yml with promtool when it is
// installed.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestAlertRulesShape holds every rule to what an operator needs (a
// severity, a summary, a runbook section that exists) and every metric it
// names to one some role exports.
func TestAlertRulesShape(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
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
	if err := yaml.UnmarshalStrict(raw, &doc); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	ops, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	metricRE := regexp.MustCompile(`payouts_[a-z_]+`)
	seen := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v lacks alert, expr, severity or summary", r)
			}
			seen[r.Alert] = true
			anchor, ok := strings.CutPrefix(r.Annotations["runbook"], "docs/operations.md#")
			if !ok || !strings.Contains(string(ops), `<a id="`+anchor+`"></a>`) {
				t.Errorf("%s: runbook %q is not a section of docs/operations.md", r.Alert, r.Annotations["runbook"])
			}
			for _, m := range metricRE.FindAllString(r.Expr, -1) {
				if !exported[m] {
					t.Errorf("%s: metric %s is exported by no role", r.Alert, m)
				}
			}
		}
	}
	for _, want := range []string{"PayoutsFencedOut", "PayoutsTokenRegression", "PayoutsDuplicateAttempt", "PayoutsRejectedTransition",
		"PayoutsLedgerDrift", "PayoutsAmbiguousOverSLA", "PayoutsReconcileFindings"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// exportedMetrics reads the metric names the roles register, from their
// source (the boundary rule keeps this test from importing them).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	nameRE := regexp.MustCompile(`Name:\s*"(payouts_[a-z_]+)"`)
	out := map[string]bool{}
	for _, glob := range []string{"*.go", "../payment/*.go", "../railproxy/*.go", "../lock/*.go"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range nameRE.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
		}
	}
	return out
}
