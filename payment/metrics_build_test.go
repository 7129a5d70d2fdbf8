package payment

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// guardDisabledGauge is the value of payouts_payment_guard_disabled a
// fresh set of the payment resource's metrics reports.
func guardDisabledGauge(t *testing.T) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	newMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "payouts_payment_guard_disabled" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("payouts_payment_guard_disabled is not exported")
	return 0
}
