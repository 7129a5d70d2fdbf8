package stack

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/payouts/payouts/dev/supervise"
)

// startServer runs a server role as an essential child and returns its
// URL once it has bound its address (reported through its address file).
func (s *Stack) startServer(ctx context.Context, name, listen string, args ...string) (string, error) {
	args = append(args, "--listen", listen, "--auth-file", s.authFile)
	scheme := "http://"
	if t := s.Ready.TLS; t != nil {
		args = append(args, "--tls-cert-file", t.Cert, "--tls-key-file", t.Key)
		scheme = "https://"
	}
	p, err := s.spawn(supervise.Spec{Name: name, Args: args, AddrFile: filepath.Join(s.opts.Dir, "run", name+".addr")}, true)
	if err != nil {
		return "", err
	}
	addr, err := p.Addr(ctx)
	if err != nil {
		return "", err
	}
	return scheme + addr, nil
}

// StartRole runs one more child of the binary (e.g. an executor) with extra
// environment env under the stack's supervision: its output goes to
// DIR/logs/NAME.log and it is stopped with the stack. Its exit is not a
// stack failure.
func (s *Stack) StartRole(name string, env []string, args ...string) (*supervise.Proc, error) {
	return s.spawn(supervise.Spec{Name: name, Env: env, Args: args}, false)
}

func (s *Stack) spawn(spec supervise.Spec, essential bool) (*supervise.Proc, error) {
	name := spec.Name
	logPath := filepath.Join(s.opts.Dir, "logs", name+".log")
	spec.Path, spec.Log = s.opts.Binary, logPath
	p, err := supervise.Start(spec)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.children[name] = p
	s.asked[name] = false
	s.Ready.PIDs[name] = p.Pid()
	s.Ready.Logs[name] = logPath
	s.mu.Unlock()
	if essential {
		go func() {
			<-p.Done()
			s.mu.Lock()
			asked := s.stopping || s.asked[name]
			s.mu.Unlock()
			if asked {
				return
			}
			select {
			case s.failed <- fmt.Errorf("%s exited (%v); see %s", name, p.ExitErr(), logPath):
			default:
			}
		}()
	}
	return p, nil
}

// Failed delivers an error when an essential child exits on its own.
func (s *Stack) Failed() <-chan error { return s.failed }

// StopRole stops one child (SIGTERM, then SIGKILL after grace).
func (s *Stack) StopRole(name string, grace time.Duration) {
	s.mu.Lock()
	p := s.children[name]
	s.asked[name] = true
	s.mu.Unlock()
	if p != nil {
		p.Stop(grace)
	}
}

// stopChildren stops every child at once and reports those that did not
// exit 0 when asked to stop.
func (s *Stack) stopChildren() []string {
	s.mu.Lock()
	s.stopping = true
	procs := make([]*supervise.Proc, 0, len(s.children))
	for _, p := range s.children {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
	)
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.Exited() {
				return // ended earlier (and reported then, if essential)
			}
			if code := p.Stop(20 * time.Second); code != 0 {
				mu.Lock()
				failed = append(failed, fmt.Sprintf("%s (exit %d; see %s)", p.Name, code, p.Spec.Log))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}
