package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/rail/railclient"
)

// The bench's duplicate count is what shows at-most-once held, so it must
// see a client reference the rail settled twice, and only this run's.
func TestE2ECountDuplicates(t *testing.T) {
	report := []railclient.Payment{
		{ClientRef: "po-run1-p1", Status: "settled"},
		{ClientRef: "po-run1-p2", Status: "settled"},
		{ClientRef: "po-run1-p2", Status: "settled"},
		{ClientRef: "po-run1-p3", Status: "declined"},
		{ClientRef: "po-run1-p3", Status: "settled"},
		{ClientRef: "po-run0-p2", Status: "settled"},
		{ClientRef: "po-run0-p2", Status: "settled"},
	}
	if got := countDuplicates(report, "po-run1-"); got != 1 {
		t.Errorf("countDuplicates = %d, want 1 (po-run1-p2)", got)
	}
}

func TestE2EQuantile(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(i + 1)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 50}, {0.99, 99}, {1, 100}} {
		if got := quantile(v, c.q); got != c.want {
			t.Errorf("quantile(1..100, %v) = %v, want %v", c.q, got, c.want)
		}
	}
}

// --baseline names the one baseline there is, runs only on the stack the
// bench starts itself, and has a bounded number of workers; --rounds is
// bounded too. --role-cpus is bounded, and limits only processes the bench
// starts, never beside a baseline.
func TestE2EOptionsRefuseBadBaseline(t *testing.T) {
	for _, c := range []struct {
		o    E2EOptions
		want string
	}{
		{E2EOptions{Accounts: 1, Payouts: 1, Baseline: "sidekiq"}, `the one baseline is "river"`},
		{E2EOptions{Accounts: 1, Payouts: 1, Baseline: BaselineRiver, BaselineWorkers: -1}, "--baseline-workers must be"},
		{E2EOptions{Accounts: 1, Payouts: 1, Baseline: BaselineRiver, PaymentURLs: []string{"http://127.0.0.1:1"},
			ProxyURLs: []string{"http://127.0.0.1:2"}, LockURL: "http://127.0.0.1:3", RailURL: "http://127.0.0.1:4",
			ExecutorToken: "x", OperatorToken: "y"}, "not with --payment-urls"},
		{E2EOptions{Accounts: 1, Payouts: 1, Rounds: -1}, "--rounds must be from 1 to 10"},
		{E2EOptions{Accounts: 1, Payouts: 1, Baseline: BaselineRiver, Rounds: 11}, "--rounds must be from 1 to 10"},
		{E2EOptions{Accounts: 1, Payouts: 1, RoleCPUs: -0.5}, "--role-cpus must be from 0"},
		{E2EOptions{Accounts: 1, Payouts: 1, RoleCPUs: 65}, "--role-cpus must be from 0"},
		{E2EOptions{Accounts: 1, Payouts: 1, RoleCPUs: 0.5, Baseline: BaselineRiver}, "--role-cpus limits payouts' roles"},
		{E2EOptions{Accounts: 1, Payouts: 1, RoleCPUs: 0.5, PaymentURLs: []string{"http://127.0.0.1:1"},
			ProxyURLs: []string{"http://127.0.0.1:2"}, LockURL: "http://127.0.0.1:3", RailURL: "http://127.0.0.1:4",
			ExecutorToken: "x", OperatorToken: "y"}, "--role-cpus limits the processes the bench starts"},
	} {
		err := c.o.defaults()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("defaults(%+v) = %v, want an error saying %q", c.o, err, c.want)
		}
	}
	ok := E2EOptions{Accounts: 1, Payouts: 1, Baseline: BaselineRiver, Replicas: 2}
	if err := ok.defaults(); err != nil || ok.BaselineWorkers != DefaultRiverWorkers || ok.Rounds != 1 {
		t.Errorf("the river baseline on the local stack: %v (workers %d, want %d by default; rounds %d, want 1)", err, ok.BaselineWorkers, DefaultRiverWorkers, ok.Rounds)
	}
}

func TestPoolRounds(t *testing.T) {
	rs := []E2EResult{
		{Payouts: 100, Posted: 99, Failed: 1, Seconds: 2, P50Ms: 10, P99Ms: 50, MaxMs: 70, ClaimWaitP50Ms: 1, ClaimWaitP99Ms: 5, PathP50Ms: 7, PathP99Ms: 40,
			CPUPer1000: map[string]float64{"payment": 1, "postgres": 2}, LoadAvg: "first", Throttled: map[string]float64{"payment": 1.5}},
		{Payouts: 100, Posted: 100, Duplicates: 1, Seconds: 3, P50Ms: 30, P99Ms: 90, MaxMs: 95, ClaimWaitP50Ms: 3, ClaimWaitP99Ms: 9, PathP50Ms: 9, PathP99Ms: 20,
			CPUPer1000: map[string]float64{"payment": 2, "postgres": 4}, LoadAvg: "second"},
		{Payouts: 100, Posted: 100, Seconds: 5, P50Ms: 20, P99Ms: 60, MaxMs: 80, ClaimWaitP50Ms: 2, ClaimWaitP99Ms: 6, PathP50Ms: 8, PathP99Ms: 30,
			CPUPer1000: map[string]float64{"payment": 3, "postgres": 3}, LoadAvg: "third", Throttled: map[string]float64{"payment": 2, "proxy": 0.25}},
	}
	got := poolRounds(rs)
	if got.Payouts != 300 || got.Posted != 299 || got.Failed != 1 || got.Duplicates != 1 || got.Seconds != 10 {
		t.Errorf("counts and time not summed: %+v", got)
	}
	if got.PayoutsPerSec != 30 {
		t.Errorf("rate %v, want 300 payouts over 10 s = 30", got.PayoutsPerSec)
	}
	if got.P50Ms != 20 || got.P99Ms != 60 || got.ClaimWaitP50Ms != 2 || got.ClaimWaitP99Ms != 6 || got.PathP50Ms != 8 || got.PathP99Ms != 30 || got.MaxMs != 95 {
		t.Errorf("latencies: want the medians (20, 60, 2, 6, 8, 30) and the largest max (95): %+v", got)
	}
	if got.CPUPer1000["payment"] != 2 || got.CPUPer1000["postgres"] != 3 {
		t.Errorf("CPU per 1,000: want each process's mean (2, 3): %v", got.CPUPer1000)
	}
	if got.Throttled["payment"] != 3.5 || got.Throttled["proxy"] != 0.25 {
		t.Errorf("time held back by --role-cpus: want each process's sum over the rounds (3.5, 0.25): %v", got.Throttled)
	}
	if got.LoadAvg != "third" {
		t.Errorf("load average %q, want the last round's", got.LoadAvg)
	}
	if rs[0].CPUPer1000["payment"] != 1 {
		t.Error("pooling changed a round's own figures")
	}
	if m := median([]float64{4, 1}); m != 2.5 {
		t.Errorf("median of two: %v, want their mean 2.5", m)
	}
	if one := poolRounds(rs[1:2]); one.Payouts != 100 || one.PayoutsPerSec != rs[1].PayoutsPerSec {
		t.Errorf("one round is not reported as it ran: %+v", one)
	}
}

// TestSummarizeSplitsTheLatency: the wait to be claimed and the path from
// claimed to terminal come from the claimed payouts only, each with its own
// quantiles; a payout never claimed (cancelled while PENDING) counts in the
// latency alone.
func TestSummarizeSplitsTheLatency(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var spans []span
	for i := range 100 {
		// Claimed 10+i ms after creation, terminal 5 ms (i < 99) or 500 ms
		// (the last one) after that.
		path := 5
		if i == 99 {
			path = 500
		}
		spans = append(spans, span{created: at(i), claimed: at(i + 10 + i), ended: at(i + 10 + i + path)})
	}
	// Five never claimed: counted in the claim wait, they would move its
	// p50 to 57 ms (the 53rd of 105).
	for range 5 {
		spans = append(spans, span{created: at(0), ended: at(3000)})
	}
	var res E2EResult
	summarize(spans, &res)
	if res.ClaimWaitP50Ms != 59 || res.ClaimWaitP99Ms != 108 {
		t.Errorf("claim wait p50 %v p99 %v, want 59 and 108 (nearest rank over the 100 claimed)", res.ClaimWaitP50Ms, res.ClaimWaitP99Ms)
	}
	if res.PathP50Ms != 5 || res.PathP99Ms != 5 {
		t.Errorf("path p50 %v p99 %v, want 5 and 5 (one slow payout in 100 is above the 99th)", res.PathP50Ms, res.PathP99Ms)
	}
	if res.MaxMs != 3000 || res.Seconds != 3 {
		t.Errorf("max %v, seconds %v: the unclaimed payouts must count in the latency", res.MaxMs, res.Seconds)
	}
}
