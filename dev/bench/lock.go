// Package bench measures the lock service against its baseline in one run:
// the service over HTTP (sessions, acquire, release) and, in alternating
// rounds on the same store, the store used directly (etcd's
// concurrency.Mutex, or PostgreSQL's conditional insert and delete).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"
)

// LockOptions configures `payouts bench lock`.
type LockOptions struct {
	Backend  string        // "etcd" or "postgres"
	Clients  int           // concurrent clients, each on its own key
	Duration time.Duration // measured time per system, split over Rounds
	Rounds   int           // alternating rounds per system (default 3)
	// EtcdEndpoints / DatabaseURL use an existing store; otherwise a
	// throwaway embedded etcd or PostgreSQL cluster is started under Dir.
	EtcdEndpoints []string
	DatabaseURL   string
	Dir           string
	// Sessions is how many live sessions the memory measurement opens
	// (default 10,000; 0 after defaults means skip).
	Sessions int
	// Progress, when set, is told what runs.
	Progress io.Writer
}

// LockResult is one run's outcome. The JSON form is exactly the keys of
// the --json line.
type LockResult struct {
	Backend           string  `json:"backend"`
	Clients           int     `json:"clients"`
	DurationS         float64 `json:"duration_s"`
	OpsPerSec         float64 `json:"ops_per_sec"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	Baseline          string  `json:"baseline"`
	BaselineOpsPerSec float64 `json:"baseline_ops_per_sec"`
	BaselineP99Ms     float64 `json:"baseline_p99_ms"`
	Ratio             float64 `json:"ratio"`

	MaxMs           float64 `json:"-"`
	BaselineP50Ms   float64 `json:"-"`
	BaselineMaxMs   float64 `json:"-"`
	BytesPerSession float64 `json:"-"`
	Rounds          []Round `json:"-"`
}

// Round is one measured round of one system.
type Round struct {
	System    string // "service" or "baseline"
	Pairs     int
	Elapsed   time.Duration
	OpsPerSec float64
	P99Ms     float64
}

// system is what a round drives: one acquire+release pair on client i's
// key, returning the acquire's latency.
type system interface {
	prepare(ctx context.Context, clients int) error
	pair(ctx context.Context, client int) (time.Duration, error)
	finish(ctx context.Context) error
}

// target is a store with the lock service on it and its baseline.
type target struct {
	service, baseline system
	baselineName      string
	// liveSessions opens n sessions through the service and returns the
	// lock service's heap growth per session.
	memory func(ctx context.Context, n int) (float64, error)
	close  func()
}

// Lock runs the benchmark.
func Lock(ctx context.Context, o LockOptions) (LockResult, error) {
	if o.Clients < 1 {
		return LockResult{}, errors.New("--clients must be at least 1")
	}
	if o.Duration <= 0 {
		return LockResult{}, errors.New("--duration must be positive")
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Dir == "" {
		dir, err := os.MkdirTemp("", "payouts-bench-lock-")
		if err != nil {
			return LockResult{}, err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
	}
	log := slog.New(slog.DiscardHandler)
	var (
		t   *target
		err error
	)
	switch o.Backend {
	case "etcd":
		t, err = etcdTarget(ctx, o, log)
	case "postgres":
		t, err = postgresTarget(ctx, o, log)
	default:
		return LockResult{}, fmt.Errorf("--backend must be etcd or postgres, got %q", o.Backend)
	}
	if err != nil {
		return LockResult{}, err
	}
	defer t.close()

	res := LockResult{Backend: o.Backend, Clients: o.Clients, DurationS: o.Duration.Seconds(), Baseline: t.baselineName}
	for _, s := range []system{t.service, t.baseline} {
		if err := s.prepare(ctx, o.Clients); err != nil {
			return res, err
		}
	}
	per := o.Duration / time.Duration(o.Rounds)
	var svcLat, baseLat []time.Duration
	var svcPairs, basePairs int
	var svcTime, baseTime time.Duration
	for r := range o.Rounds {
		// Each system goes first in every other round (service, baseline,
		// baseline, service, ...): neither always runs on the store as the
		// other left it, nor always first.
		order := []string{"service", "baseline"}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, which := range order {
			s := t.service
			if which == "baseline" {
				s = t.baseline
			}
			fmt.Fprintf(o.Progress, "round %d/%d: %s, %d clients, %s\n", r+1, o.Rounds, which, o.Clients, per)
			lat, elapsed, err := runRound(ctx, s, o.Clients, per)
			if err != nil {
				return res, fmt.Errorf("%s round %d: %w", which, r+1, err)
			}
			res.Rounds = append(res.Rounds, Round{System: which, Pairs: len(lat), Elapsed: elapsed,
				OpsPerSec: float64(len(lat)) / elapsed.Seconds(), P99Ms: pct(sorted(lat), 0.99)})
			if which == "service" {
				svcLat, svcPairs, svcTime = append(svcLat, lat...), svcPairs+len(lat), svcTime+elapsed
			} else {
				baseLat, basePairs, baseTime = append(baseLat, lat...), basePairs+len(lat), baseTime+elapsed
			}
		}
	}
	for _, s := range []system{t.service, t.baseline} {
		if err := s.finish(ctx); err != nil {
			return res, err
		}
	}
	svcLat, baseLat = sorted(svcLat), sorted(baseLat)
	res.OpsPerSec = float64(svcPairs) / svcTime.Seconds()
	res.P50Ms, res.P99Ms, res.MaxMs = pct(svcLat, 0.50), pct(svcLat, 0.99), pct(svcLat, 1)
	res.BaselineOpsPerSec = float64(basePairs) / baseTime.Seconds()
	res.BaselineP50Ms, res.BaselineP99Ms, res.BaselineMaxMs = pct(baseLat, 0.50), pct(baseLat, 0.99), pct(baseLat, 1)
	if res.BaselineOpsPerSec > 0 {
		res.Ratio = lockRound3(res.OpsPerSec / res.BaselineOpsPerSec)
	}
	res.OpsPerSec, res.BaselineOpsPerSec = lockRound1(res.OpsPerSec), lockRound1(res.BaselineOpsPerSec)
	if o.Sessions > 0 {
		fmt.Fprintf(o.Progress, "memory: %d live sessions\n", o.Sessions)
		if res.BytesPerSession, err = t.memory(ctx, o.Sessions); err != nil {
			return res, fmt.Errorf("memory per session: %w", err)
		}
	}
	return res, nil
}

// runRound runs clients goroutines doing pairs for d and returns every
// acquire latency and the elapsed time.
func runRound(ctx context.Context, s system, clients int, d time.Duration) ([]time.Duration, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type out struct {
		lat []time.Duration
		err error
	}
	results := make(chan out, clients)
	start := time.Now()
	stop := start.Add(d)
	for c := range clients {
		go func() {
			lat := make([]time.Duration, 0, 4096)
			for time.Now().Before(stop) {
				l, err := s.pair(ctx, c)
				if err != nil {
					cancel()
					results <- out{lat, err}
					return
				}
				lat = append(lat, l)
			}
			results <- out{lat, nil}
		}()
	}
	var (
		all      []time.Duration
		firstErr error
	)
	for range clients {
		r := <-results
		all = append(all, r.lat...)
		if r.err != nil && firstErr == nil && !errors.Is(r.err, context.Canceled) {
			firstErr = r.err
		}
	}
	return all, time.Since(start), firstErr
}

func sorted(d []time.Duration) []time.Duration {
	slices.Sort(d)
	return d
}

// pct is the q-quantile of sorted latencies, in milliseconds.
func pct(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return lockRound3(float64(d[nearestRank(len(d), q)]) / float64(time.Millisecond))
}

func lockRound1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
func lockRound3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }
