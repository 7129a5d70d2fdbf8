// Package deploy_test checks the deployment files against the code: the
// Prometheus rules (promtool check and unit tests), the compose file's
// command lines against the binary's flags, and the Grafana dashboard's
// queries against the metrics the roles export.
package deploy_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// moduleRoot is the repository root, one level above this directory.
const moduleRoot = ".."

// tool finds a command the deployment checks need. CI installs Debian's
// prometheus package (promtool, prometheus); a missing tool is a failure,
// never a skip, so the check cannot pass by not running.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: install Debian's prometheus package (.ci/run does): %v", name, err)
	}
	return p
}

var (
	metricLiteralRE = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(payouts_[a-z0-9_]+)"`)
	metricRefRE     = regexp.MustCompile(`\bpayouts_[a-z0-9_]+\b`)
)

// exportedMetrics reads the names of the metrics the roles register from
// their source: every "payouts_..." metric name given as Name: or to
// NewDesc in a production Go file outside the dev tooling and the tests.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "dev", "e2e", "deploy", "bin", ".dev", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricLiteralRE.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 20 {
		t.Fatalf("found only %d metric names in the source; the scan is broken: %v", len(out), out)
	}
	return out
}

// unknownMetrics lists the payouts_* names expr refers to that no role
// exports (a histogram's _bucket, _sum and _count series count as its own).
func unknownMetrics(expr string, exported map[string]bool) []string {
	var out []string
	for _, m := range metricRefRE.FindAllString(expr, -1) {
		base := m
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suffix); ok && exported[b] {
				base = b
			}
		}
		if !exported[base] {
			out = append(out, m)
		}
	}
	return out
}
