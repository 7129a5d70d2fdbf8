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

// Proc is one running child process.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
	err     error
	logFile *os.File
}

// Start runs the binary with args; stdout and stderr go to a log file under
// the test's temp dir. The process is killed when the test ends if it is
// still running.
func Start(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	bin := Binary(t)
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("proctest: start %s: %v", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{}), logFile: f}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		// Resume first: a stopped process cannot handle SIGKILL's cleanup otherwise.
		_ = p.Signal(syscall.SIGCONT)
		_ = p.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("--- %s log (%s) ---\n%s", name, logPath, tail(p.Log(), 60))
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	return p.Cmd.Process.Signal(sig)
}

// Pause freezes the process (SIGSTOP); Resume thaws it (SIGCONT).
func (p *Proc) Pause() error  { return p.Signal(syscall.SIGSTOP) }
func (p *Proc) Resume() error { return p.Signal(syscall.SIGCONT) }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits for the process to exit (up to timeout) and returns its exit code.
func (p *Proc) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		return -1, fmt.Errorf("%s did not exit within %s", p.Name, timeout)
	}
	if p.Cmd.ProcessState == nil {
		return -1, p.err
	}
	return p.Cmd.ProcessState.ExitCode(), nil
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log returns everything the process has written so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// WaitLog polls the log until it contains substr.
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
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
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
