package executor

import (
	"log/slog"
	"time"

	"github.com/payouts/payouts/internal/railgate"
)

// While the rail gives no usable answer, claiming more payouts only turns
// more of them RAIL_AMBIGUOUS (their money held until the reconciler finds
// the rail's evidence). So after railgate.TripAfter submissions in a row
// without a usable answer — a TIMEOUT from the proxy, no answer from the
// proxy, or the proxy saying it forwards nothing while the rail is paused —
// the executor claims no new payouts for a pause, then one as a probe
// (internal/railgate). Payouts already in flight are finished as always;
// nothing here decides a payout's fate, it only delays claims.

// railAnswer records a submission's answer in the gate, and says so in the
// log and the metrics when claims stop or resume.
func (e *Executor) railAnswer(log *slog.Logger, usable bool) {
	ev, pause, failures := e.rail.Observe(time.Now(), usable)
	switch ev {
	case railgate.Paused:
		e.m.railPaused.Set(1)
		e.m.railPauses.Inc()
		log.Warn("the rail gave no usable answer to several submissions in a row: claiming no new payouts for a while, then one to probe it (payouts in flight are finished as always)",
			"submissions", failures, "retry_in", pause.String())
	case railgate.Extended:
		log.Warn("the probe payout got no usable answer from the rail either: claiming no new payouts for longer",
			"submissions", failures, "retry_in", pause.String())
	case railgate.Resumed:
		e.m.railPaused.Set(0)
		log.Info("the rail answered again: claiming new payouts", "unanswered_before", failures)
	}
}
