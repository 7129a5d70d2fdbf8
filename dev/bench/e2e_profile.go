package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"
)

// E2EProfileEnv names the directory where a payouts process built with
// -tags pprof writes the address of its net/http/pprof listener, as
// PID.addr. `bench e2e --profile DIR` sets it for every child it starts
// and collects CPU profiles from each during the run.
const E2EProfileEnv = "PAYOUTS_PPROF_ADDR_DIR"

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
	ctx, cancel := context.WithCancel(ctx)
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
	addrDir := os.Getenv(E2EProfileEnv)
	for name, pid := range sys.cpu.pids {
		if name == "bench" {
			continue // profiled in process above
		}
		b, err := os.ReadFile(filepath.Join(addrDir, strconv.Itoa(pid)+".addr"))
		if err != nil {
			if name != "postgres" {
				o.Logger.Warn("no pprof address for a process (build with -tags pprof to profile it)", "process", name)
			}
			continue
		}
		addr := strings.TrimSpace(string(b))
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				path := filepath.Join(o.ProfileDir, fmt.Sprintf("%s-%03d.pprof", name, k))
				if err := fetchProfile(ctx, addr, path); err != nil && ctx.Err() == nil {
					o.Logger.Warn("cpu profile failed", "process", name, "error", err.Error())
					return
				}
			}
		}()
	}
	return p
}

// stop ends profiling; the slice in progress is dropped.
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
