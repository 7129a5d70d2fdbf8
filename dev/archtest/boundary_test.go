// Package archtest holds tests about the code's shape rather than its
// behaviour: the trust boundaries of DESIGN §1 hold in the import graph.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/payouts/payouts/"

// roles are the top-level role directories. Each may import another role's
// client packages only, never its server code.
var roles = []string{"lock", "payment", "railproxy", "rail", "executor", "reconcile"}

// clientPkgs are the only packages of a role that others may import.
var clientPkgs = map[string]bool{
	"lock/lockclient":         true,
	"lock/fencing":            true,
	"payment/paymentclient":   true,
	"railproxy/proxyclient":   true,
	"rail/railclient":         true,
	"executor/executorclient": true,
}

func roleOf(rel string) string {
	for _, r := range roles {
		if rel == r || strings.HasPrefix(rel, r+"/") {
			return r
		}
	}
	return ""
}

type pkg struct {
	path string
	test bool // a test variant (in-package or external _test package)
	deps []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}|{{join .Deps " "}}`, "github.com/payouts/payouts/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, deps, _ := strings.Cut(line, "|")
		// Test variants look like "p [p.test]" or "p_test [p.test]"; keep the
		// package path and remember it is test code.
		path, variant, _ := strings.Cut(path, " ")
		if strings.HasSuffix(path, ".test") {
			continue
		}
		isTest := variant != "" || strings.HasSuffix(path, "_test")
		path = strings.TrimSuffix(path, "_test")
		var ds []string
		for _, d := range strings.Fields(deps) {
			d, _, _ = strings.Cut(d, " ")
			if strings.HasPrefix(d, module) {
				ds = append(ds, strings.TrimPrefix(d, module))
			}
		}
		if path+"/" == module {
			path = module + "main"
		}
		pkgs = append(pkgs, pkg{path: strings.TrimPrefix(path, module), test: isTest, deps: ds})
	}
	return pkgs
}

// violation returns why importer may not depend on dep, or "".
func violation(importer, dep string) string {
	ir, dr := roleOf(importer), roleOf(dep)
	if dr == "" {
		return "" // internal/, migrations, cmd-free plumbing
	}
	if importer == "main" || importer == "cmd" || strings.HasPrefix(importer, "cmd/") || importer == "e2e" || strings.HasPrefix(importer, "e2e/") {
		return "" // the command tree and whole-system tests wire every role
	}
	if clientPkgs[importer] && !clientPkgs[dep] {
		return "a client package may depend only on other client packages and internal plumbing"
	}
	if ir == dr {
		return ""
	}
	if strings.HasPrefix(importer, "internal/") && !clientPkgs[dep] {
		return "internal plumbing may not depend on a role's server code"
	}
	if !clientPkgs[dep] {
		return "a role may depend on another role only through its client package"
	}
	return ""
}

func TestRoleBoundaries(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	for _, p := range pkgs {
		for _, d := range p.deps {
			// The rail stub stands in for the external network: tests of the
			// proxy may run it in process, as they would a real rail's sandbox.
			if p.test && d == "rail" {
				continue
			}
			if why := violation(p.path, d); why != "" {
				t.Errorf("%s depends on %s: %s (DESIGN §1)", p.path, d, why)
			}
		}
	}
}

// TestRuleCatchesViolations keeps the rule itself honest.
func TestRuleCatchesViolations(t *testing.T) {
	bad := [][2]string{
		{"executor", "payment"},
		{"executor", "payment/store"},
		{"reconcile", "railproxy"},
		{"payment/paymentclient", "payment"},
		{"railproxy", "lock/pgbackend"},
		{"internal/httpx", "payment"},
	}
	for _, b := range bad {
		if violation(b[0], b[1]) == "" {
			t.Errorf("rule lets %s import %s", b[0], b[1])
		}
	}
	good := [][2]string{
		{"executor", "payment/paymentclient"},
		{"executor", "lock/lockclient"},
		{"reconcile", "railproxy/proxyclient"},
		{"payment", "payment/store"},
		{"payment/paymentclient", "lock/fencing"},
		{"cmd", "payment"},
		{"payment", "internal/httpx"},
	}
	for _, g := range good {
		if why := violation(g[0], g[1]); why != "" {
			t.Errorf("rule refuses %s -> %s: %s", g[0], g[1], why)
		}
	}
}
