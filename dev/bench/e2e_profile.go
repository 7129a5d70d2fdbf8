package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"time"
)

// pprofEnv makes every child the bench starts serve net/http/pprof on a
// loopback port of its own (--pprof-listen from the environment); each
// logs the address it bound as {"msg":"pprof listening","addr":...}.
const pprofEnv = "PAYOUTS_PPROF_LISTEN"

// profileSlice is the length of one CPU profile; a run yields one file
// per slice per process (`go tool pprof` merges them).
const profileSlice = 5 * time.Second

type profiler struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	self   *os.File // this process's own profile (the embedded etcd runs here)
}

// startProfiles fetches consecutive CPU profiles from every child that
// serves pprof until stop is called.
func (sys *e2eSystem) startProfiles(ctx context.Context, o E2EOptions) *profiler {
	// done ends the loop of slices; the slice in progress is finished.
	done, cancel := context.WithCancel(ctx)
	p := &profiler{cancel: cancel}
	if o.ProfileDir == "" {
		return p
	}
	if f, err := os.Create(filepath.Join(o.ProfileDir, "bench.pprof")); err == nil {
		if pprof.StartCPUProfile(f) == nil {
			p.self = f
		} else {
			f.Close()
		}
	}
	for name, logPath := range sys.logs {
		addr, err := loggedAddr(logPath, "pprof listening")
		if err != nil {
			o.Logger.Warn("no pprof address for a process", "process", name, "error", err.Error())
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for k := 0; done.Err() == nil; k++ {
				path := filepath.Join(o.ProfileDir, fmt.Sprintf("%s-%03d.pprof", name, k))
				if err := fetchProfile(ctx, addr, path); err != nil {
					o.Logger.Warn("cpu profile failed", "process", name, "error", err.Error())
					return
				}
			}
		}()
	}
	return p
}

// stop ends profiling once every slice in progress is written.
func (p *profiler) stop() {
	p.cancel()
	p.wg.Wait()
	if p.self != nil {
		pprof.StopCPUProfile()
		p.self.Close()
	}
}

func fetchProfile(ctx context.Context, addr, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(profileSlice/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// loggedAddr finds the address a process logged with message msg
// ({"msg":msg,"addr":...}) in its log file. Only the profiler uses it: a
// pprof listener is optional and bound on port 0 by every child, and the
// bench reads where it landed after the run is up.
func loggedAddr(path, msg string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg && rec.Addr != "" {
			return rec.Addr, nil
		}
	}
	return "", fmt.Errorf("%s has no %q line", path, msg)
}
