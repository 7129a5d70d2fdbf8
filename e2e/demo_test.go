package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// demo runs `payouts dev demo` in dir and returns its console (stdout and
// stderr together) and exit code.
func (b *devBundle) demo(dir string, args ...string) (string, int) {
	b.t.Helper()
	c := b.start(nil, append([]string{"dev", "demo", "--dir", dir}, args...)...)
	code := c.wait(b.t, 10*time.Minute)
	return c.output(), code
}

// processesUsing lists running processes whose command line mentions dir
// (the roles, executors and PostgreSQL all name it).
func processesUsing(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if strings.Trim(e.Name(), "0123456789") != "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		line := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(line, dir) {
			pid := 0
			for _, c := range e.Name() {
				pid = pid*10 + int(c-'0')
			}
			if alive(pid) {
				out = append(out, e.Name()+": "+line)
			}
		}
	}
	return out
}

// checkDemo asserts the demo's exit code and closing summary, that its
// console holds nothing that reads as a failure (an error line, a panic, a
// stack trace: the stack stopping included), and that it left no process
// behind.
func checkDemo(t *testing.T, dir, stdout string, code int) {
	t.Helper()
	if code != 0 {
		t.Fatalf("dev demo exited %d\noutput:\n%s\n%s", code, stdout, roleLogTails(dir, 40))
	}
	checkCleanConsole(t, "dev demo", stdout)
	for _, want := range []string{
		"== 1. Payouts flowing",
		"== 2. UC-03",
		"SIGSTOP exec-2",
		"SIGCONT exec-2",
		"FENCED OUT at the ",
		"== 3. Ambiguous payouts",
		"payouts reconcile --once --json (pass 1)",
		"== 4. Summary",
		"duplicate payments at the rail: 0\n",
		"ledger balanced: yes",
		"The story held",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the demo's output lacks %q\n%s", want, stdout)
		}
	}
	// The money, three ways: settled at the rail, POSTED, and paid out by
	// the ledger's own entries; equal, and something was paid.
	money := regexp.MustCompile(`money settled at the rail for POSTED payouts: (\d+); POSTED: (\d+); paid out in the ledger: (\d+)`).FindStringSubmatch(stdout)
	if money == nil || money[1] != money[2] || money[2] != money[3] || money[1] == "0" {
		t.Errorf("the demo's money line %q: want three equal amounts above 0\n%s", money, stdout)
	}
	// The reconciler's exit code is reported; with the fences on record it
	// is 1 (findings), and nothing but that evidence was found.
	m := regexp.MustCompile(`reconciler exit code: (\d)(.*)`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no reconciler exit code in the summary:\n%s", stdout)
	}
	if m[1] != "0" && m[1] != "1" {
		t.Errorf("final reconciler exit code %s, want 0 or 1: %s", m[1], m[0])
	}
	if m[1] == "1" && !strings.Contains(m[2], "expected in this story") {
		t.Errorf("the reconciler found more than the guards' evidence: %s", m[0])
	}
	// A holder frozen by timing is fenced by whichever guard its next
	// write goes to: a fence at either is the story.
	if payment, proxy := fencedPerGuard(t, stdout); payment+proxy == 0 {
		t.Errorf("the summary shows no fence at either guard (payment %d, proxy %d)", payment, proxy)
	}
	if !regexp.MustCompile(`60 payouts: .*POSTED \d+`).MatchString(stdout) {
		t.Errorf("the summary does not account for the 60 payouts:\n%s", stdout)
	}
	// Everything it started is gone.
	var left []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		if left = processesUsing(dir); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("processes left behind by the demo:\n%s", strings.Join(left, "\n"))
	}
}

// fencedPerGuard reads the summary's count of fenced-out events per guard.
func fencedPerGuard(t *testing.T, stdout string) (payment, proxy int) {
	t.Helper()
	m := regexp.MustCompile(`fenced-out events per guard:\s+payment (\d+), proxy (\d+)`).FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no fenced-out count per guard in the summary:\n%s", stdout)
	}
	payment, _ = strconv.Atoi(m[1])
	proxy, _ = strconv.Atoi(m[2])
	return payment, proxy
}

// TestDevDemo runs the demo as `make demo` does (a binary with the
// executor's hold hook): both guards fence a frozen holder out.
func TestDevDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	b := setup(t)
	dir := filepath.Join(b.dir, "demo")
	stdout, code := b.demo(dir)
	checkDemo(t, dir, stdout, code)
	// Held at its hook, exec-2's next write is a payment step and exec-3's
	// a submission: one fence at each guard. A holder frozen by timing is
	// fenced by whichever guard its next write goes to.
	for _, want := range []string{"SIGSTOP exec-3", "FENCED OUT at the payment guard", "FENCED OUT at the proxy", "holders frozen at the executor's hold hook"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("the demo's output lacks %q\n%s", want, stdout)
		}
	}
	if payment, proxy := fencedPerGuard(t, stdout); payment == 0 || proxy == 0 {
		t.Errorf("the summary shows fences payment %d, proxy %d; want one at each guard", payment, proxy)
	}

	// A second run on the same directory starts afresh.
	stdout, code = b.demo(dir, "--freeze", "timing")
	checkDemo(t, dir, stdout, code)
	if !strings.Contains(stdout, "holder frozen by timing") {
		t.Errorf("--freeze timing did not say how the holder was frozen:\n%s", stdout)
	}
}

// TestDevDemoRefusesAForeignDirectory: the demo wipes only directories it
// made itself.
func TestDevDemoRefusesAForeignDirectory(t *testing.T) {
	b := setup(t)
	dir := b.dir
	precious := filepath.Join(dir, "precious.txt")
	if err := os.WriteFile(precious, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := b.demo(dir)
	if code != 2 || !strings.Contains(out, "not empty") {
		t.Fatalf("dev demo on a foreign non-empty directory: exit %d, output:\n%s", code, out)
	}
	checkCleanConsole(t, "dev demo on a foreign directory", out)
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("the demo touched a directory it did not make: %v", err)
	}
}

// roleLogTails is the last n lines of each executor's, the lock service's
// and the proxy's log in the demo's directory: the directory goes with the
// test, and a demo that gave up waiting says only what it waited for.
func roleLogTails(dir string, n int) string {
	var b strings.Builder
	for _, name := range []string{"exec-1", "exec-2", "exec-3", "lock", "proxy"} {
		raw, err := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		fmt.Fprintf(&b, "--- last %d lines of %s.log:\n%s\n", min(n, len(lines)), name, strings.Join(lines[max(0, len(lines)-n):], "\n"))
	}
	return b.String()
}
