// Package railgate decides when to stop sending new payments to a rail that
// gives no usable answer.
//
// When the rail refuses connections, times out or answers 5xx, every
// payment sent meanwhile is ambiguous: its money is held until the
// reconciler finds the rail's evidence. Sending more into an outage only
// makes more of them. After TripAfter payments in a row without a usable
// answer, a Gate admits nothing new for a pause, then one payment as a
// probe: an answer from the rail (paid or declined) ends the pause, none
// doubles it (PauseMin to PauseMax).
//
// The executor keeps one to stop claiming new payouts; the rail proxy keeps
// one to stop forwarding new submissions, whichever executor sends them.
package railgate

import (
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// TripAfter is how many payments in a row without a usable answer
	// start a pause.
	TripAfter = 8
	// PauseMin is the first pause; each failed probe doubles it up to
	// PauseMax.
	PauseMin = 2 * time.Second
	PauseMax = time.Minute
)

// Gate is one caller's view of whether the rail answers. The zero value is
// open. It is safe for concurrent use.
type Gate struct {
	mu sync.Mutex
	// failures counts payments in a row that got no usable answer.
	failures int
	// pause is the current pause (0: payments flow).
	pause time.Duration
	// nextProbe is when the next payment may go while paused.
	nextProbe time.Time
	// probed is set when a probe was let through since the pause began or
	// last doubled: only a failure after it doubles the pause, not the
	// answers of payments already in flight when the pause began.
	probed bool
}

// Event is what an answer changed.
type Event int

const (
	Same     Event = iota
	Paused         // new payments stop
	Extended       // a probe got no usable answer: a longer pause
	Resumed        // the rail answered: payments flow again
)

// Admit is how many of n new payments may go now: all of them unless
// paused; while paused none, except one once the pause has run out (the
// probe, after which the pause starts over).
func (g *Gate) Admit(now time.Time, n int) int {
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

// PausedUntil is when a payment may next go, zero when payments are not
// paused.
func (g *Gate) PausedUntil() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pause == 0 {
		return time.Time{}
	}
	return g.nextProbe
}

// Observe records a payment's answer: usable is an answer from the rail
// (paid or declined); not usable is none (a timeout, a 5xx, no connection).
// It returns what changed, the pause now in force and the failures in a
// row (before a resume: those the resume ended).
func (g *Gate) Observe(now time.Time, usable bool) (Event, time.Duration, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if usable {
		failures, was := g.failures, g.pause
		g.failures, g.pause, g.probed = 0, 0, false
		if was > 0 {
			return Resumed, 0, failures
		}
		return Same, 0, 0
	}
	if g.failures < math.MaxInt {
		g.failures++
	}
	switch {
	case g.pause == 0 && g.failures >= TripAfter:
		g.pause, g.nextProbe, g.probed = PauseMin, now.Add(PauseMin), false
		return Paused, g.pause, g.failures
	case g.pause > 0 && g.probed:
		g.pause = min(2*g.pause, PauseMax)
		g.nextProbe, g.probed = now.Add(g.pause), false
		return Extended, g.pause, g.failures
	}
	return Same, 0, 0
}

// Reporter says, in the log and the metrics, when a gate stops or resumes
// payments: a gauge at 1 while paused, a counter of pauses, and the
// messages of the WARN line on pausing, the WARN line on a failed probe and
// the INFO line on resuming.
type Reporter struct {
	Paused                     prometheus.Gauge
	Pauses                     prometheus.Counter
	OnPause, OnProbe, OnResume string
}

// Observe records a payment's answer in g (Gate.Observe) and reports what
// it changed.
func (r Reporter) Observe(g *Gate, log *slog.Logger, now time.Time, usable bool) {
	ev, pause, failures := g.Observe(now, usable)
	switch ev {
	case Paused:
		r.Paused.Set(1)
		r.Pauses.Inc()
		log.Warn(r.OnPause, "submissions", failures, "retry_in", pause.String())
	case Extended:
		log.Warn(r.OnProbe, "submissions", failures, "retry_in", pause.String())
	case Resumed:
		r.Paused.Set(0)
		log.Info(r.OnResume, "unanswered_before", failures)
	}
}
