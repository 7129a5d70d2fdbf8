// Package supervise runs child processes for the local stack and for the
// whole-system tests: each child's output goes to its own log file, a
// server child reports the address it bound through a file it is handed
// (never through its log), and readiness is one loop that also notices a
// child that died.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/payouts/payouts/internal/httpx"
)

// Spec describes one child.
type Spec struct {
	Name string
	Path string // the executable
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Log receives the child's stderr, and its stdout unless Stdout is set
	// (appended; created 0644).
	Log string
	// Stdout, when set, receives the child's stdout alone (truncated): a
	// command whose output is a report.
	Stdout string
	// AddrFile, when set, is handed to the child (PAYOUTS_ADDR_FILE): a
	// server writes its bound address there once it listens. Any file
	// left from an earlier run is removed first.
	AddrFile string
	// DeathSignal is sent to the child if this process dies (default
	// SIGTERM): children never outlive their supervisor.
	DeathSignal syscall.Signal
}

// Proc is a running (or exited) child.
type Proc struct {
	Spec
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the child.
func Start(spec Spec) (*Proc, error) {
	if spec.DeathSignal == 0 {
		spec.DeathSignal = syscall.SIGTERM
	}
	f, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	files := []*os.File{f}
	if spec.Stdout != "" {
		out, err := os.Create(spec.Stdout)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("start %s: %w", spec.Name, err)
		}
		cmd.Stdout = out
		files = append(files, out)
	}
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	cmd.Env = append(os.Environ(), spec.Env...)
	if spec.AddrFile != "" {
		if err := os.Remove(spec.AddrFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			closeFiles()
			return nil, fmt.Errorf("start %s: %w", spec.Name, err)
		}
		cmd.Env = append(cmd.Env, httpx.AddrFileEnv+"="+spec.AddrFile)
	}
	// Its own process group, so a terminal's Ctrl-C reaches the
	// supervisor only, which then stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: spec.DeathSignal, Setpgid: true}
	if err := cmd.Start(); err != nil {
		closeFiles()
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Proc{Spec: spec, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		closeFiles()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the child (nothing once it has exited).
func (p *Proc) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	return p.cmd.Process.Signal(sig)
}

// Pause freezes the child (SIGSTOP); Resume thaws it (SIGCONT).
func (p *Proc) Pause() error  { return p.Signal(syscall.SIGSTOP) }
func (p *Proc) Resume() error { return p.Signal(syscall.SIGCONT) }

// Kill sends SIGKILL and waits until the child is gone.
func (p *Proc) Kill() {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop asks the child to stop (SIGTERM; a paused child is thawed first)
// and kills it if it has not exited after grace. It returns the exit code
// (-1 when killed by a signal).
func (p *Proc) Stop(grace time.Duration) int {
	_ = p.Signal(syscall.SIGCONT)
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
	return p.cmd.ProcessState.ExitCode()
}

// Wait waits up to timeout for the child to exit and returns its exit code.
func (p *Proc) Wait(timeout time.Duration) (int, error) {
	if !p.Exited() {
		select {
		case <-p.done:
		case <-time.After(timeout):
			return -1, fmt.Errorf("%s did not exit within %s", p.Name, timeout)
		}
	}
	if p.cmd.ProcessState == nil {
		return -1, p.err
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// ExitErr is how the child ended (nil before it has, or on exit 0).
func (p *Proc) ExitErr() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Log is everything the child has written so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.Spec.Log)
	return string(b)
}

// LogTail is the last n lines of the child's log.
func (p *Proc) LogTail(n int) string { return Tail(p.Log(), n) }

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exitedErr says the child died during start, and where to read why.
func (p *Proc) exitedErr(during string) error {
	return fmt.Errorf("%s exited (%v) %s; see %s", p.Name, p.err, during, p.Spec.Log)
}

// Addr waits until the child has written its bound address to its
// AddrFile and returns it (host:port).
func (p *Proc) Addr(ctx context.Context) (string, error) {
	if p.AddrFile == "" {
		return "", fmt.Errorf("%s was started without an address file", p.Name)
	}
	for {
		if b, err := os.ReadFile(p.AddrFile); err == nil {
			if addr := strings.TrimSpace(string(b)); addr != "" {
				return addr, nil
			}
		}
		select {
		case <-p.done:
			return "", p.exitedErr("before it listened")
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not report its address: %w; see %s", p.Name, ctx.Err(), p.Spec.Log)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Ready waits until url+"/readyz" answers 200 (client: nil for the
// default), failing at once if the child exits.
func (p *Proc) Ready(ctx context.Context, client *http.Client, url string) error {
	err := waitReady(ctx, client, url, p.done)
	if p.Exited() {
		return p.exitedErr("before it was ready")
	}
	if err != nil {
		return fmt.Errorf("%w; see %s", err, p.Spec.Log)
	}
	return nil
}

// WaitReady waits until url+"/readyz" answers 200 (a server this process
// did not start).
func WaitReady(ctx context.Context, client *http.Client, url string) error {
	return waitReady(ctx, client, url, nil)
}

func waitReady(ctx context.Context, client *http.Client, url string, gone <-chan struct{}) error {
	if client == nil {
		client = http.DefaultClient
	}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-gone:
			return fmt.Errorf("%s: the server exited", url)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
