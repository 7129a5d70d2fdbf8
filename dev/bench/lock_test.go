package bench

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// TestLockBench runs a short benchmark on each backend and checks the
// --json line carries exactly the keys of the contract, with both systems
// measured.
func TestLockBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd")
	}
	want := []string{"backend", "baseline", "baseline_ops_per_sec", "baseline_p99_ms", "clients", "duration_s", "ops_per_sec", "p50_ms", "p99_ms", "ratio"}
	for _, backend := range []string{"postgres", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			res, err := Lock(ctx, LockOptions{Backend: backend, Clients: 2, Duration: time.Second, Rounds: 2, Sessions: 1000, Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, want) {
				t.Fatalf("--json keys %v; want exactly %v", keys, want)
			}
			if res.OpsPerSec <= 0 || res.BaselineOpsPerSec <= 0 || res.Ratio <= 0 || res.P99Ms <= 0 || len(res.Rounds) != 4 {
				t.Fatalf("a system was not measured: %+v", res)
			}
			if res.BytesPerSession <= 0 {
				t.Fatalf("memory per session not measured: %+v", res)
			}
		})
	}
}
