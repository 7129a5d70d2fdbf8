package bench

import (
	"strings"
	"testing"

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
// bench starts itself, and has a bounded number of workers.
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
	} {
		err := c.o.defaults()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("defaults(%+v) = %v, want an error saying %q", c.o, err, c.want)
		}
	}
	ok := E2EOptions{Accounts: 1, Payouts: 1, Baseline: BaselineRiver, Replicas: 2}
	if err := ok.defaults(); err != nil || ok.BaselineWorkers != DefaultRiverWorkers {
		t.Errorf("the river baseline on the local stack: %v (workers %d, want %d by default)", err, ok.BaselineWorkers, DefaultRiverWorkers)
	}
}
