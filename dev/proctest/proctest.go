// Package proctest runs the real payouts binary as child processes for
// whole-system tests: built once per test binary, each child's output kept
// in a log file, and every child stopped when the test ends.
package proctest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/supervise"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildDir  string
)

// moduleRoot finds the directory holding go.mod from this source file.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Binary builds the payouts binary (once per test binary) and returns its path.
// Build tags, if any, come from PAYOUTS_TEST_BUILD_TAGS.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "payouts-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "payouts")
		args := []string{"build", "-o", binPath}
		if tags := os.Getenv("PAYOUTS_TEST_BUILD_TAGS"); tags != "" {
			args = append(args, "-tags", tags)
		}
		args = append(args, ".")
		cmd := exec.Command("go", args...)
		cmd.Dir = moduleRoot()
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out.String())
		}
	})
	if buildErr != nil {
		t.Fatalf("proctest: %v", buildErr)
	}
	return binPath
}

// Cleanup removes the built binary; call from TestMain after m.Run.
func Cleanup() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// Main is a test binary's TestMain: it runs the tests, then stop (when
// not nil: what the tests left running), removes the built binary, and
// fails a passing run that left goroutines behind (goleak, with opts).
func Main(m *testing.M, stop func(), opts ...goleak.Option) {
	code := m.Run()
	if stop != nil {
		stop()
	}
	Cleanup()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines left behind by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Proc is one running child process.
type Proc struct {
	*supervise.Proc
}

// Start runs the binary with args; stdout and stderr go to a log file under
// the test's temp dir. The process is killed when the test ends if it is
// still running.
func Start(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	p, err := supervise.Start(supervise.Spec{Name: name, Path: Binary(t), Args: args, Env: env,
		Log: filepath.Join(t.TempDir(), name+".log"), DeathSignal: syscall.SIGKILL})
	if err != nil {
		t.Fatalf("proctest: %v", err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- %s log (%s) ---\n%s", name, p.Spec.Log, p.LogTail(60))
		}
	})
	return &Proc{p}
}

// WaitLog polls the log until it contains substr (for tests whose subject
// is what a process logs).
func (p *Proc) WaitLog(ctx context.Context, substr string) error {
	for {
		if strings.Contains(p.Log(), substr) {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited before logging %q", p.Name, substr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never logged %q: %w", p.Name, substr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitReady polls url+"/readyz" until it answers 200.
func WaitReady(ctx context.Context, url string) error {
	return supervise.WaitReady(ctx, nil, url)
}

// Metric reads one sample (its exact name with labels, as exposed) from a
// Prometheus text endpoint; 0 when the sample is absent.
func Metric(t testing.TB, metricsURL, sample string) float64 {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatalf("scrape %s: %v", metricsURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", metricsURL, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return 0
}
