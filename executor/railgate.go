package executor

import (
	"log/slog"
	"math"
	"sync"
	"time"
)

// When the rail gives no usable answer — it refuses connections, times
// out, answers 5xx — every payout submitted meanwhile becomes
// RAIL_AMBIGUOUS: its money is held until the reconciler finds the rail's
// evidence, and one the rail never saw then ends FAILED. Claiming more
// payouts into an outage only turns more of them ambiguous, so after
// railTripAfter submissions in a row without a usable answer the executor
// claims no new payouts for a pause, then lets one through as a probe: an
// answer from the rail (paid or declined) ends the pause, none doubles it
// (railPauseMin to railPauseMax). Payouts already in flight are finished
// as always; nothing here decides a payout's fate, it only delays claims.
const (
	railTripAfter = 8
	railPauseMin  = 2 * time.Second
	railPauseMax  = time.Minute
)

// railGate is the executor's view of whether the rail answers.
type railGate struct {
	mu sync.Mutex
	// failures counts submissions in a row that got no usable answer.
	failures int
	// pause is the current pause (0: claims flow).
	pause time.Duration
	// nextProbe is when the next payout may be claimed while paused.
	nextProbe time.Time
	// probed is set when a probe was let through since the pause began or
	// last doubled: only a failure after it doubles the pause, not the
	// answers of submissions already in flight when the pause began.
	probed bool
}

// gateEvent is what an answer changed.
type gateEvent int

const (
	gateSame     gateEvent = iota
	gatePaused             // claims stop
	gateExtended           // a probe got no usable answer: a longer pause
	gateResumed            // the rail answered: claims flow again
)

// admit is how many of n PENDING payouts a round may claim now: all of
// them unless paused; while paused none, except one once the pause has
// run out (the probe, after which the pause starts over).
func (g *railGate) admit(now time.Time, n int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pause == 0 || n == 0 {
		return n
	}
	if now.Before(g.nextProbe) {
		return 0
	}
	g.nextProbe, g.probed = now.Add(g.pause), true
	return 1
}

// pausedUntil is when claims may next be made, zero when they are not
// paused.
func (g *railGate) pausedUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pause == 0 {
		return time.Time{}
	}
	return g.nextProbe
}

// observe records a submission's answer: usable is an answer from the rail
// (paid or declined), not usable is none (TIMEOUT, or no answer from the
// proxy at all).
func (g *railGate) observe(now time.Time, usable bool) (gateEvent, time.Duration, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if usable {
		failures, was := g.failures, g.pause
		g.failures, g.pause, g.probed = 0, 0, false
		if was > 0 {
			return gateResumed, 0, failures
		}
		return gateSame, 0, 0
	}
	if g.failures < math.MaxInt {
		g.failures++
	}
	switch {
	case g.pause == 0 && g.failures >= railTripAfter:
		g.pause, g.nextProbe, g.probed = railPauseMin, now.Add(railPauseMin), false
		return gatePaused, g.pause, g.failures
	case g.pause > 0 && g.probed:
		g.pause = min(2*g.pause, railPauseMax)
		g.nextProbe, g.probed = now.Add(g.pause), false
		return gateExtended, g.pause, g.failures
	}
	return gateSame, 0, 0
}

// railAnswer records a submission's answer in the gate, and says so in the
// log and the metrics when claims stop or resume.
func (e *Executor) railAnswer(log *slog.Logger, usable bool) {
	ev, pause, failures := e.rail.observe(time.Now(), usable)
	switch ev {
	case gatePaused:
		e.m.railPaused.Set(1)
		e.m.railPauses.Inc()
		log.Warn("the rail gave no usable answer to several submissions in a row: claiming no new payouts for a while, then one to probe it (payouts in flight are finished as always)",
			"submissions", failures, "retry_in", pause.String())
	case gateExtended:
		log.Warn("the probe payout got no usable answer from the rail either: claiming no new payouts for longer",
			"submissions", failures, "retry_in", pause.String())
	case gateResumed:
		e.m.railPaused.Set(0)
		log.Info("the rail answered again: claiming new payouts", "unanswered_before", failures)
	}
}
