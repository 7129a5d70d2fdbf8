package reconcile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fileMetrics writes the metrics file from a registry holding only the
// reconciler's series (node_exporter has its own process metrics).
//
// A cron job is a new process every run, so the file starts from the one
// the previous run left: counters go on counting (a rate over the file is
// a rate, not a saw-tooth of per-run counts), and a run that cannot
// complete keeps the last completed pass's findings and success time —
// "last success" stays the time of the last success, which is what the
// staleness alert measures.
type fileMetrics struct {
	path string
	reg  *prometheus.Registry
	m    *Metrics
}

// newFileMetrics prepares the metrics file at path (nil when path is
// empty). A previous file that cannot be read is reported and replaced.
func newFileMetrics(path string) (*fileMetrics, error) {
	if path == "" {
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	f := &fileMetrics{path: path, reg: reg, m: NewMetrics(reg)}
	prev, err := readMetricsFile(path)
	if err != nil {
		return f, fmt.Errorf("read the previous --metrics-file %s (starting afresh): %w", path, err)
	}
	f.m.carryOver(prev)
	return f, nil
}

func readMetricsFile(path string) (map[string]*dto.MetricFamily, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(fh)
}

func (f *fileMetrics) write(rep *Report, err error, took time.Duration, end time.Time) error {
	if f == nil {
		return nil
	}
	f.m.Observe(rep, err, took, end)
	// Durably, as the state file: a run saves its state only after this
	// file holds what the state will no longer report, and a crash of the
	// host must not take the file back to before it. Readable by all, as
	// a textfile collector running as another user needs.
	families, gerr := f.reg.Gather()
	if gerr != nil {
		return fmt.Errorf("write --metrics-file %s: %w", f.path, gerr)
	}
	commit, werr := prepareFile("--metrics-file "+f.path, f.path, 0o644, func(w io.Writer) error {
		for _, mf := range families {
			if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
				return err
			}
		}
		return nil
	})
	if werr != nil {
		return werr
	}
	return commit(true)
}

// carryOver sets the series a run must not reset from a previous run's
// values: the counters, the last success time, and what the last completed
// pass found. up, the last run time and the duration are this run's own.
func (m *Metrics) carryOver(prev map[string]*dto.MetricFamily) {
	gauge := func(g prometheus.Gauge) func(prometheus.Labels, float64) error {
		return func(_ prometheus.Labels, v float64) error { g.Set(v); return nil }
	}
	gaugeVec := func(g *prometheus.GaugeVec) func(prometheus.Labels, float64) error {
		return func(l prometheus.Labels, v float64) error {
			s, err := g.GetMetricWith(l)
			if err == nil {
				s.Set(v)
			}
			return err
		}
	}
	counterVec := func(c *prometheus.CounterVec) func(prometheus.Labels, float64) error {
		return func(l prometheus.Labels, v float64) error {
			s, err := c.GetMetricWith(l)
			if err == nil && v > 0 {
				s.Add(v)
			}
			return err
		}
	}
	carried := map[string]func(prometheus.Labels, float64) error{
		"payouts_reconcile_resolved_total":                 counterVec(m.resolved),
		"payouts_reconcile_passes_total":                   counterVec(m.passes),
		"payouts_reconcile_last_success_timestamp_seconds": gauge(m.lastSuccess),
		"payouts_reconcile_findings":                       gaugeVec(m.findings),
		"payouts_reconcile_ambiguous_unresolved":           gauge(m.unresolved),
		"payouts_reconcile_highest_fence":                  gauge(m.highestFence),
		"payouts_reconcile_guard_high_fence":               gaugeVec(m.guardFence),
		"payouts_reconcile_lock_high_token":                gauge(m.lockHighToken),
		"payouts_reconcile_scanned":                        gaugeVec(m.scanned),
	}
	for name, fam := range prev {
		set := carried[name]
		if set == nil {
			continue
		}
		for _, s := range fam.GetMetric() {
			labels := prometheus.Labels{}
			for _, lp := range s.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			v := s.GetGauge().GetValue()
			if s.Counter != nil {
				v = s.GetCounter().GetValue()
			}
			// A series this version no longer has (a renamed label) is
			// dropped rather than failing the run.
			_ = set(labels, v)
		}
	}
}
