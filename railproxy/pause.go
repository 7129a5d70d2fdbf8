package railproxy

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/railgate"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// The rail pause. While the rail gives no usable answer (it refuses
// connections, times out, answers 5xx), every submission forwarded turns
// its payout RAIL_AMBIGUOUS: its money is held until the reconciler finds
// the rail's evidence. Each executor stops claiming after a few of its own
// submissions fail, but several executors each make that many. So the
// proxy, which sees every submission, keeps a gate too (internal/railgate):
// after railgate.TripAfter forwards in a row without a usable answer it
// forwards no new submission for a pause, then one as a probe, and the
// first answer from the rail ends the pause.
//
// A submission that is not admitted is neither recorded nor forwarded: it
// is answered 503 unavailable with forwarded=false, and its payout stays
// RAIL_SUBMITTED for the executor to submit again later (nothing reached
// the rail). Guard 2 still runs first, in a transaction that is rolled
// back, so a stale token during a pause is fenced out with its evidence as
// always rather than hidden behind the pause.

// now is the rail pause's clock: time.Now, or the tests' clock.
func (s *Server) now() time.Time { return s.cfg.now() }

// railAnswer records a forward's answer in the gate, and says so in the
// log and the metrics when forwarding stops or resumes.
func (s *Server) railAnswer(log *slog.Logger, usable bool) {
	railgate.Reporter{
		Paused: s.m.railPaused, Pauses: s.m.railPauses,
		OnPause:  "the rail gave no usable answer to several submissions in a row: forwarding no new submissions for a while, then one to probe it (the others are answered 503, not recorded, nothing sent)",
		OnProbe:  "the probe submission got no usable answer from the rail either: forwarding no new submissions for longer",
		OnResume: "the rail answered again: forwarding submissions",
	}.Observe(&s.gate, log, s.now(), usable)
}

// retryIn is how long until the pause lets the next submission through
// (0 when it already would).
func (s *Server) retryIn() time.Duration {
	return max(s.gate.PausedUntil().Sub(s.now()), 0)
}

// pausedProblem is the answer to a submission not admitted while the rail
// is paused, wait before the pause lets one through.
func pausedProblem(wait time.Duration) *problem.Error {
	return problem.New(problem.Unavailable,
		"the rail has given no usable answer to the last submissions: this one was not recorded and not forwarded (nothing was sent); submit it again in %s or later",
		wait.Round(time.Millisecond)).With(proxyclient.ForwardedExtension, false)
}

// paused answers a submission of reqs (one, or a whole batch) not admitted
// while the rail is paused: guard 2 first, so that a stale token is fenced
// out as always, and a payout already forwarded is a duplicate attempt as
// always, then 503 with Retry-After.
func (s *Server) paused(ctx context.Context, w http.ResponseWriter, log *slog.Logger, reqs []proxyclient.SubmitRequest) error {
	req, n := reqs[0], len(reqs)
	cctx, cancel := context.WithTimeout(ctx, dbTimeout)
	hw, fenced, err := s.st.checkFence(cctx, req)
	cancel()
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "the rail is paused and the submission's fence could not be checked; it was not recorded or forwarded").
			With(proxyclient.ForwardedExtension, false)
	}
	if fenced {
		return s.fencedOut(ctx, log, reqs, hw)
	}
	// A payout already forwarded is a duplicate attempt whether the rail
	// answers or not: its evidence is recorded as when it does. A single
	// submission is answered as then (409); a batch still 503, which
	// forwards nothing.
	for _, r := range reqs {
		cctx, cancel := context.WithTimeout(ctx, dbTimeout)
		_, err := s.st.forwarded(cctx, r.PayoutID)
		cancel()
		if err != nil {
			continue // none (or proxydb cannot say): nothing is forwarded either way
		}
		if n == 1 { // its log names the payout already
			return s.duplicate(ctx, log, r)
		}
		_ = s.duplicate(ctx, log.With(obs.KeyPayoutID, r.PayoutID), r)
	}
	wait := s.retryIn()
	why := pausedProblem(wait)
	w.Header().Set("Retry-After", strconv.Itoa(int(max(wait, time.Second).Round(time.Second)/time.Second)))
	s.m.pausedRefusals.Add(float64(n))
	log.Info("the rail is paused: submission answered 503, not recorded, not forwarded", obs.KeyError, why.Message)
	return why
}
