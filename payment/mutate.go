package payment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Op is a fenced mutation endpoint.
type Op string

// The fenced mutations.
const (
	OpClaim      Op = "claim"
	OpSubmitting Op = "submitting"
	OpOutcome    Op = "outcome"
	OpPost       Op = "post"
	OpResolve    Op = "resolve"
	OpCancel     Op = "cancel"
	OpAbandon    Op = "abandon"
	OpRefuse     Op = "refuse"
)

// Ops lists every fenced mutation.
var Ops = []Op{OpClaim, OpSubmitting, OpOutcome, OpPost, OpResolve, OpCancel, OpAbandon, OpRefuse}

// Command is one validated fenced mutation request.
type Command struct {
	Op     Op
	Token  fencing.Token
	Holder fencing.Holder
	Actor  string // who acts: role:name of the authenticated caller

	Outcome    pc.Outcome    // OpOutcome
	RailRef    string        // OpOutcome
	ErrorCode  string        // OpOutcome, OpRefuse
	Resolution pc.Resolution // OpResolve
	Text       string        // OpResolve/OpRefuse evidence, OpCancel/OpAbandon reason
}

// event maps a command to its state-machine event. Claims on a PENDING
// payout depend on the funds and are decided in the transaction.
func (c Command) event() Event {
	switch c.Op {
	case OpClaim:
		return EvClaim
	case OpSubmitting:
		return EvSubmitting
	case OpOutcome:
		switch c.Outcome {
		case pc.OutcomeAcked:
			return EvRailAcked
		case pc.OutcomeRejected:
			return EvRailDeclined
		default:
			return EvRailTimeout
		}
	case OpPost:
		return EvPost
	case OpResolve:
		if c.Resolution == pc.ResolutionSettled {
			return EvResolveSettled
		}
		return EvResolveAbsent
	case OpCancel:
		return EvCancel
	case OpRefuse:
		return EvRailRefused
	default:
		return EvAbandon
	}
}

// rejection is why a fenced transaction was rolled back; it is recorded as
// a safety event after the rollback, in a transaction of its own.
type rejection struct {
	fenced bool  // guard 1 refused the token
	fence  fence // what guard 1 answered (the fence that refused)
	state  pc.State
	event  Event
	payout pc.Payout
}

// Apply performs one fenced mutation on a payout. The transaction's first
// statement is guard 1 (advanceFence); then the transition table decides.
// A rejected request changes nothing — the fence included — and leaves only
// its safety-event rows.
func (s *Service) Apply(ctx context.Context, payoutID string, cmd Command) (pc.Payout, error) {
	if err := cmd.Token.Check(); err != nil {
		return pc.Payout{}, problem.New(problem.InvalidRequest, "token: %v", err)
	}
	if cmd.Holder == "" {
		return pc.Payout{}, problem.New(problem.InvalidRequest, "holder: required")
	}
	p, rej, err := s.applyTx(ctx, payoutID, cmd)
	if err != nil {
		return pc.Payout{}, err
	}
	if rej != nil {
		s.afterRefusalHook()
		return pc.Payout{}, s.reject(ctx, rej.fence.account, payoutID, cmd, rej)
	}
	return p, nil
}

func (s *Service) applyTx(ctx context.Context, payoutID string, cmd Command) (pc.Payout, *rejection, error) {
	tx, err := pgpool.Begin(ctx, s.pool)
	if err != nil {
		return pc.Payout{}, nil, err
	}
	defer tx.Rollback(ctx)

	// A claim reads the held amount (D-7) in the guard's round trip.
	o, err := open(ctx, tx, fenceOf{payoutID: payoutID}, cmd, []string{payoutID}, cmd.Op == OpClaim)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && o.fence.accepted && len(o.payouts) == 0) {
		return pc.Payout{}, nil, problem.New(problem.NotFound, "no payout %q", payoutID)
	}
	if err != nil {
		return pc.Payout{}, nil, err
	}
	if !o.fence.accepted {
		return pc.Payout{}, &rejection{fenced: true, fence: o.fence}, nil
	}
	ch, rej, err := s.decideOne(ctx, tx, o.payouts[0], cmd, o.funds)
	if err != nil || rej != nil {
		if rej != nil {
			rej.fence = o.fence
		}
		return pc.Payout{}, rej, err
	}
	tx.CommitAfterNextBatch() // COMMIT rides behind the write batch
	out, err := writeChanges(ctx, tx, cmd, o.fence.account, []change{ch})
	if err != nil {
		return pc.Payout{}, nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return pc.Payout{}, nil, fmt.Errorf("commit %s: %w", cmd.Op, err)
	}
	s.m.transitions.WithLabelValues(string(ch.from.State), string(ch.to)).Inc()
	if ch.from.State == pc.RailAmbiguous && ch.to.Actionable() {
		// A resolution made an ambiguous payout actionable again
		// (RAIL_ACKED: to be posted): executors waiting for work are
		// told, as when payouts are created.
		s.workArrived()
	}
	return out[0], nil, nil
}

// checkResolutionSLA refuses abandoning a payout that has been ambiguous
// for less than the resolution SLA: abandoning releases its held amount
// while the rail may still pay, and time short of the SLA is no evidence.
// The age is measured by the database clock from the payout's entry into
// RAIL_AMBIGUOUS (ambiguousSinceSQL).
func (s *Service) checkResolutionSLA(ctx context.Context, tx *pgpool.Tx, p pc.Payout) error {
	var since time.Time
	var ageSeconds float64
	err := tx.QueryRow(ctx, ambiguousSinceSQL, p.ID, string(pc.RailAmbiguous)).Scan(&since, &ageSeconds)
	if err != nil {
		return fmt.Errorf("read when payout %s became ambiguous: %w", p.ID, err)
	}
	age := time.Duration(ageSeconds * float64(time.Second))
	if age >= s.sla {
		return nil
	}
	return problem.New(problem.Conflict,
		"payout %s has been RAIL_AMBIGUOUS for %s (since %s); abandon is allowed only once the resolution SLA of %s has passed, in %s: resolve it from rail evidence meanwhile",
		p.ID, age.Round(time.Second), since.UTC().Format(time.RFC3339), s.sla, (s.sla-age).Round(time.Second)).
		With("payout_id", p.ID).With("ambiguous_since", since.UTC()).
		With("ambiguous_for_seconds", int64(age.Seconds())).With("resolution_sla_seconds", int64(s.sla.Seconds()))
}

// reject records a rejected request's evidence and builds its error.
func (s *Service) reject(ctx context.Context, accountID, payoutID string, cmd Command, rej *rejection) error {
	key := fencing.Key(accountID)
	// Evidence must outlive a caller that hangs up.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// A fenced-out request is judged from the fence that refused it, as
	// guard 1's own statement returned it: a fence read now could have moved
	// since and hide a token regression. A rejected transition passed the
	// guard inside a transaction that was rolled back; its evidence shows
	// the fence as it stands.
	// A fence that cannot be read does not swallow the rejection: its
	// evidence then carries the fence the guard returned in the rolled-back
	// transaction, and the answer stays invalid_transition.
	stored, storedHolder := int64(rej.fence.token), string(rej.fence.holder)
	var readErr error
	if !rej.fenced {
		var t int64
		var h string
		if readErr = s.pool.QueryRow(ctx, `SELECT fence_token, fence_holder FROM account WHERE id = $1`, accountID).Scan(&t, &h); readErr == nil {
			stored, storedHolder = t, h
		}
	}
	log := s.logFor(ctx).With(obs.KeyKey, key, obs.KeyToken, int64(cmd.Token), "stored_token", stored,
		obs.KeyHolder, string(cmd.Holder), "stored_holder", storedHolder,
		obs.KeyPayoutID, payoutID, obs.KeyAccountID, accountID, "op", string(cmd.Op), "actor", cmd.Actor)
	if readErr != nil {
		log.Warn("could not read the fence after a rejected transition; its evidence carries the fence the guard returned",
			obs.KeyError, readErr.Error())
	}
	ev := safetylog.Event{Key: key, Presented: cmd.Token, Stored: fencing.Token(stored), Holder: cmd.Holder, StoredHolder: fencing.Holder(storedHolder), PayoutID: payoutID}

	if rej.fenced {
		regression := stored == int64(cmd.Token) && storedHolder != string(cmd.Holder)
		fenced := ev
		fenced.Kind = pc.KindFencedOut
		fenced.Detail = fmt.Sprintf("%s refused: token %d is not above the fence %d of %s", cmd.Op, cmd.Token, stored, key)
		events := []safetylog.Event{fenced}
		s.m.fencedOut.Inc()
		log.Warn("fenced out: stale token refused by guard 1", obs.KeyEvent, pc.KindFencedOut)
		if regression {
			reg := ev
			reg.Kind = pc.KindTokenRegression
			reg.Detail = fmt.Sprintf("token %d presented by holder %q but already accepted from holder %q: a token was re-issued (INV-04)", cmd.Token, cmd.Holder, storedHolder)
			events = append(events, reg)
			s.m.tokenRegressions.Inc()
			log.Warn("token regression: equal token from a different holder", obs.KeyEvent, pc.KindTokenRegression)
		}
		s.recordSafety(ctx, log, events...)
		if regression {
			return problem.Fenced(key, int64(cmd.Token), stored,
				"token %d for %s was already accepted from another holder (%s): a token was issued twice (token_regression)", cmd.Token, key, storedHolder).
				With("payout_id", payoutID).With(problem.TokenRegressionMember, true)
		}
		return problem.Fenced(key, int64(cmd.Token), stored,
			"token %d is stale for %s (fence %d); this holder no longer holds the lock", cmd.Token, key, stored).
			With("payout_id", payoutID)
	}

	s.m.rejectedTransitions.WithLabelValues(string(rej.state), string(rej.event)).Inc()
	log.Warn("rejected transition", obs.KeyEvent, pc.KindRejectedTransition, "state", string(rej.state), "payout_event", string(rej.event))
	ev.Kind = pc.KindRejectedTransition
	ev.Detail = fmt.Sprintf("%s (%s) is not allowed in state %s", cmd.Op, rej.event, rej.state)
	s.recordSafety(ctx, log, ev)
	return problem.New(problem.InvalidTransition, "payout %s is %s; %s is not allowed in that state", payoutID, rej.state, rej.event).
		With("state", rej.state).With("event", rej.event).With("payout", rej.payout)
}

// recordSafety writes safety events in a transaction of their own. A
// failure to store them is logged and counted; the log line and counters
// have already fired.
func (s *Service) recordSafety(ctx context.Context, log interface {
	Error(msg string, args ...any)
}, events ...safetylog.Event) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return safetylog.Insert(ctx, tx, events...) })
	if err != nil {
		s.m.safetyWriteFailures.Inc()
		log.Error("could not store safety event", obs.KeyError, err.Error())
	}
}

// logFor is the request's logger (with its request id), or the service's
// logger for calls made outside an HTTP request.
func (s *Service) logFor(ctx context.Context) *slog.Logger {
	if l := httpx.Log(ctx); l != slog.Default() {
		return l
	}
	return s.log
}

// ambiguousSinceSQL is when payout $1 last entered state $2 and how long
// ago, by the database clock; its events are found, in byte order, through
// payout_event_digest_idx.
const ambiguousSinceSQL = `SELECT max(at), EXTRACT(EPOCH FROM now() - max(at))::float8
	FROM payout_event WHERE payout_id COLLATE "C" = $1 AND to_state = $2`
