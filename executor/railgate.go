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
	railgate.Reporter{
		Paused: e.m.railPaused, Pauses: e.m.railPauses,
		OnPause:  "the rail gave no usable answer to several submissions in a row: claiming no new payouts for a while, then one to probe it (payouts in flight are finished as always)",
		OnProbe:  "the probe payout got no usable answer from the rail either: claiming no new payouts for longer",
		OnResume: "the rail answered again: claiming new payouts",
	}.Observe(&e.rail, log, time.Now(), usable)
}
