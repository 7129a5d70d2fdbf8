// Package archtest holds tests about the code's shape rather than its
// behaviour: the rooms of DESIGN §1 and docs/architecture.md hold in the
// import graph.
//
// The rules, for every package of the module and every import it makes:
//  1. Plumbing (internal/...) imports no role (not even a client package)
//     and no dev tooling. One exception: the fencing vocabulary
//     (lock/fencing: the token and holder types every wire contract
//     carries), which itself imports nothing of the module (rule 0), so
//     importing it pulls no role in.
//  2. No role's production code (lock, payment, railproxy, rail, executor,
//     reconcile, migrations and their subpackages; not their tests)
//     imports dev tooling (dev/...).
//  3. A client package imports no server code: only other client
//     packages and plumbing.
//  4. A role imports another role only through that role's client package.
//
// The command tree (main, cmd/), dev tooling (dev/) and the whole-system
// tests (e2e/, negativecontrol/) sit above the roles and wire them.
package archtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const module = "github.com/payouts/payouts/"

// roles are the top-level role directories (rules 3 and 4).
var roles = []string{"lock", "payment", "railproxy", "rail", "executor", "reconcile"}

// production are the trees whose non-test code may not import dev tooling
// (rule 2): the roles and the migrations they apply.
var production = append([]string{"migrations"}, roles...)

// clientPkgs are the only packages of a role that others may import.
var clientPkgs = map[string]bool{
	"lock/lockclient":       true,
	"lock/fencing":          true,
	"payment/paymentclient": true,
	"railproxy/proxyclient": true,
	"rail/railclient":       true,
}

// under returns which of trees holds rel ("" for none).
func under(rel string, trees []string) string {
	for _, r := range trees {
		if rel == r || strings.HasPrefix(rel, r+"/") {
			return r
		}
	}
	return ""
}

func isPlumbing(rel string) bool { return under(rel, []string{"internal"}) != "" }
func isDev(rel string) bool      { return under(rel, []string{"dev"}) != "" }

type pkg struct {
	path    string
	test    bool // a test variant (in-package or external _test package)
	imports []string
}

// listPackages lists every package of the module with its direct imports
// inside the module, test variants included.
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-test", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, module+"...")
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
		path, imports, _ := strings.Cut(line, "|")
		// Test variants look like "p [p.test]" or "p_test [p.test]"; keep the
		// package path and remember it is test code.
		path, variant, _ := strings.Cut(path, " ")
		if strings.HasSuffix(path, ".test") {
			continue
		}
		isTest := variant != "" || strings.HasSuffix(path, "_test")
		path = strings.TrimSuffix(path, "_test")
		var is []string
		for _, d := range strings.Fields(imports) {
			d, _, _ = strings.Cut(d, " ")
			if strings.HasPrefix(d, module) {
				is = append(is, strings.TrimPrefix(d, module))
			}
		}
		if path+"/" == module {
			path = module + "main"
		}
		pkgs = append(pkgs, pkg{path: strings.TrimPrefix(path, module), test: isTest, imports: is})
	}
	return pkgs
}

// vocabulary is the one role package plumbing may import (rule 1).
const vocabulary = "lock/fencing"

// violation returns which rule forbids importer (test code or not) to
// import dep, or "".
func violation(importer, dep string, test bool) string {
	if importer == vocabulary && !test {
		return "rule 0: the fencing vocabulary imports nothing of the module"
	}
	if isPlumbing(importer) {
		if (under(dep, roles) != "" && dep != vocabulary) || dep == "migrations" || isDev(dep) {
			return "rule 1: plumbing imports no role and no dev tooling"
		}
		return ""
	}
	if !test && under(importer, production) != "" && isDev(dep) {
		return "rule 2: a role's production code imports no dev tooling"
	}
	dr := under(dep, roles)
	if dr == "" {
		return "" // plumbing, migrations, dev tooling (for tests)
	}
	if clientPkgs[importer] && !clientPkgs[dep] {
		return "rule 3: a client package imports only client packages and plumbing"
	}
	ir := under(importer, roles)
	if ir == "" || ir == dr {
		return "" // the command tree, dev tooling and whole-system tests wire every role
	}
	if !clientPkgs[dep] {
		return "rule 4: a role imports another role only through its client package"
	}
	return ""
}

func TestRoleBoundaries(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	for _, p := range pkgs {
		for _, d := range p.imports {
			// The rail stub stands in for the external network: tests of the
			// proxy may run it in process, as they would a real rail's sandbox.
			if p.test && d == "rail" {
				continue
			}
			if why := violation(p.path, d, p.test); why != "" {
				t.Errorf("%s imports %s: %s (docs/architecture.md)", p.path, d, why)
			}
		}
	}
}

// TestClientPackagesExist keeps the list of client packages true: a
// package named there that does not exist would allow nothing and hide a
// typo.
func TestClientPackagesExist(t *testing.T) {
	for p := range clientPkgs {
		if _, err := os.Stat("../../" + p); err != nil {
			t.Errorf("client package %s: %v", p, err)
		}
	}
}

// TestRuleCatchesViolations keeps each rule honest: one import it must
// refuse and one it must allow, at least, per rule.
func TestRuleCatchesViolations(t *testing.T) {
	cases := []struct {
		importer, dep string
		test          bool
		ok            bool
	}{
		// Rule 1: plumbing.
		{"internal/httpx", "payment", false, false},
		{"internal/httpx", "lock/lockclient", false, false},
		{"internal/wire", "lock/fencing", false, true},
		{"lock/fencing", "internal/problem", false, false},
		{"internal/obs", "migrations", false, false},
		{"internal/auth", "dev/infra", false, false},
		{"internal/httpx", "dev/pgtest", true, false},
		{"internal/httpx", "internal/problem", false, true},
		// Rule 2: roles' production code and dev tooling.
		{"lock", "dev/infra", false, false},
		{"lock/etcdbackend", "dev/infra", false, false},
		{"migrations", "dev/pgtest", false, false},
		{"reconcile", "dev/stack", false, false},
		{"payment", "dev/pgtest", true, true},
		{"lock/etcdbackend", "dev/infra", true, true},
		{"dev/infra", "lock/etcdbackend", false, true},
		{"dev/demo", "reconcile", false, true},
		{"cmd", "dev/stack", false, true},
		// Rule 3: client packages.
		{"payment/paymentclient", "payment", false, false},
		{"lock/lockclient", "lock/etcdbackend", false, false},
		{"railproxy/proxyclient", "railproxy", true, false},
		{"payment/paymentclient", "lock/fencing", false, true},
		{"lock/lockclient", "internal/httpx", false, true},
		// Rule 4: roles.
		{"executor", "payment", false, false},
		{"executor", "payment/store", false, false},
		{"reconcile", "railproxy", false, false},
		{"railproxy", "lock/pgbackend", false, false},
		{"executor", "payment/paymentclient", false, true},
		{"executor", "lock/lockclient", false, true},
		{"reconcile", "railproxy/proxyclient", false, true},
		{"payment", "payment/store", false, true},
		{"cmd", "payment", false, true},
		{"e2e", "railproxy", true, true},
		{"payment", "internal/httpx", false, true},
	}
	for _, c := range cases {
		why := violation(c.importer, c.dep, c.test)
		switch {
		case c.ok && why != "":
			t.Errorf("rule refuses %s -> %s (test %v): %s", c.importer, c.dep, c.test, why)
		case !c.ok && why == "":
			t.Errorf("rule lets %s import %s (test %v)", c.importer, c.dep, c.test)
		}
	}
}
