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
		if hook := s.afterRefusal.Load(); hook != nil {
			(*hook)()
		}
		return pc.Payout{}, s.reject(ctx, rej.fence.account, payoutID, cmd, rej)
	}
	return p, nil
}

func (s *Service) applyTx(ctx context.Context, payoutID string, cmd Command) (pc.Payout, *rejection, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pc.Payout{}, nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	f, err := advanceFence(ctx, tx, payoutID, cmd.Token, cmd.Holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return pc.Payout{}, nil, problem.New(problem.NotFound, "no payout %q", payoutID)
	}
	if err != nil {
		return pc.Payout{}, nil, fmt.Errorf("advance fence: %w", err)
	}
	accountID := f.account
	if !f.accepted {
		return pc.Payout{}, &rejection{fenced: true, fence: f}, nil
	}
	balance := f.balance
	p, err := getPayout(ctx, tx, payoutID, true)
	if err != nil {
		return pc.Payout{}, nil, err
	}
	ev := cmd.event()
	var available int64
	if cmd.Op == OpClaim && p.State == pc.Pending {
		held, err := heldAmount(ctx, tx, accountID)
		if err != nil {
			return pc.Payout{}, nil, err
		}
		available = balance - held
		if available < p.Amount {
			ev = EvInsufficientFunds
		}
	}
	to, ok := decide(p.State, ev)
	if !ok {
		return pc.Payout{}, &rejection{fence: f, state: p.State, event: ev, payout: p}, nil
	}
	if ev == EvAbandon {
		// Refused before the SLA: the transaction rolls back, the fence included.
		if err := s.checkResolutionSLA(ctx, tx, p); err != nil {
			return pc.Payout{}, nil, err
		}
	}

	var (
		claim, submitted, settled bool
		failure, railRef, errCode *string
		reason                    string
	)
	str := func(v string) *string {
		if v == "" {
			return nil
		}
		return &v
	}
	switch ev {
	case EvClaim:
		claim = true
		reason = "claimed"
		if p.State == pc.Claimed {
			reason = fmt.Sprintf("re-claimed from %s (token %d)", p.ClaimedBy, p.Token)
		}
	case EvInsufficientFunds:
		failure = str(pc.FailureInsufficientFunds)
		reason = fmt.Sprintf("%s: available %d < amount %d", pc.FailureInsufficientFunds, available, p.Amount)
	case EvSubmitting:
		submitted = true
		reason = "submitting to the rail proxy"
	case EvRailAcked, EvRailDeclined, EvRailTimeout:
		railRef, errCode = str(cmd.RailRef), str(cmd.ErrorCode)
		reason = fmt.Sprintf("outcome %s", cmd.Outcome)
		if cmd.RailRef != "" {
			reason += " rail_ref=" + cmd.RailRef
		}
		if cmd.ErrorCode != "" {
			reason += " error_code=" + cmd.ErrorCode
		}
		if ev == EvRailDeclined {
			failure = str("rail_declined")
		}
	case EvRailRefused:
		failure, errCode = str(pc.FailureRailRefused), str(cmd.ErrorCode)
		reason = fmt.Sprintf("refused by the rail proxy without forwarding (%s): %s", cmd.ErrorCode, cmd.Text)
	case EvPost:
		settled = true
		reason = "posted"
		if err := postLedger(ctx, tx, p, cmd.Token); err != nil {
			return pc.Payout{}, nil, err
		}
	case EvResolveSettled, EvResolveAbsent:
		reason = fmt.Sprintf("resolution %s: %s", cmd.Resolution, cmd.Text)
		if ev == EvResolveAbsent {
			failure = str("rail_absent")
		}
	case EvCancel:
		failure = str("cancelled")
		reason = cmd.Text
	case EvAbandon:
		failure = str("abandoned")
		reason = cmd.Text
	}
	from := p.State
	// The payout's update and its event are one statement (one round trip).
	p, err = scanPayout(tx.QueryRow(ctx, `WITH u AS (
		UPDATE payout SET
			state = $2, token = $3,
			claimed_by = CASE WHEN $4 THEN $5 ELSE claimed_by END,
			claimed_at = CASE WHEN $4 THEN now() ELSE claimed_at END,
			submitted_at = CASE WHEN $6 THEN now() ELSE submitted_at END,
			settled_at = CASE WHEN $7 THEN now() ELSE settled_at END,
			failure_reason = COALESCE($8, failure_reason),
			rail_ref = COALESCE($9, rail_ref),
			rail_error_code = COALESCE($10, rail_error_code)
		WHERE id = $1 RETURNING *
	), e AS (
		INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor, reason)
		SELECT u.id, $11, u.state, u.token, $5, $12, $13 FROM u
	)
	SELECT `+payoutCols+` FROM u`,
		payoutID, string(to), int64(cmd.Token), claim, string(cmd.Holder), submitted, settled, failure, railRef, errCode,
		string(from), cmd.Actor, reason))
	if err != nil {
		return pc.Payout{}, nil, fmt.Errorf("update payout and record its event: %w", err)
	}
	if settled {
		// Last before the commit: every posting of every account credits
		// this one row, so its lock is held for as short a time as can be.
		if err := creditClearing(ctx, tx, p.Amount); err != nil {
			return pc.Payout{}, nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return pc.Payout{}, nil, fmt.Errorf("commit %s: %w", cmd.Op, err)
	}
	s.m.transitions.WithLabelValues(string(from), string(to)).Inc()
	return p, nil, nil
}

// checkResolutionSLA refuses abandoning a payout that has been ambiguous
// for less than the resolution SLA: abandoning releases its held amount
// while the rail may still pay, and time short of the SLA is no evidence.
// The age is measured by the database clock from the payout's entry into
// RAIL_AMBIGUOUS.
func (s *Service) checkResolutionSLA(ctx context.Context, tx pgx.Tx, p pc.Payout) error {
	var since time.Time
	var ageSeconds float64
	err := tx.QueryRow(ctx, `SELECT max(at), EXTRACT(EPOCH FROM now() - max(at))::float8
		FROM payout_event WHERE payout_id = $1 AND to_state = $2`, p.ID, string(pc.RailAmbiguous)).Scan(&since, &ageSeconds)
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

// postLedger writes the payout's ledger group — debit the account, credit
// payout-clearing, both under the token — and debits the account's
// balance, in the caller's transaction (INV-03); creditClearing moves the
// clearing balance at the end of the same transaction. The group sums to
// zero by construction and the deferred trigger checks it at commit.
func postLedger(ctx context.Context, tx pgx.Tx, p pc.Payout, token fencing.Token) error {
	group := "post:" + p.ID
	if _, err := tx.Exec(ctx, `INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token)
		VALUES ($1, $2, -$3::bigint, $4, $5, $6), ($1, $4, $3, $2, $5, $6)`,
		group, p.AccountID, p.Amount, pc.ClearingAccount, p.ID, int64(token)); err != nil {
		return fmt.Errorf("post ledger: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE account SET balance = balance - $2, updated_at = now() WHERE id = $1`, p.AccountID, p.Amount); err != nil {
		return fmt.Errorf("update balance: %w", err)
	}
	return nil
}

// creditClearing credits payout-clearing with a posted amount. The row is
// shared by every account, so callers run it last in their transaction.
func creditClearing(ctx context.Context, tx pgx.Tx, amount int64) error {
	if _, err := tx.Exec(ctx, `UPDATE account SET balance = balance + $2, updated_at = now() WHERE id = $1`, pc.ClearingAccount, amount); err != nil {
		return fmt.Errorf("update the clearing balance: %w", err)
	}
	return nil
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
	stored, storedHolder := int64(rej.fence.token), string(rej.fence.holder)
	if !rej.fenced {
		if err := s.pool.QueryRow(ctx, `SELECT fence_token, fence_holder FROM account WHERE id = $1`, accountID).Scan(&stored, &storedHolder); err != nil {
			return fmt.Errorf("read fence after rejection: %w", err)
		}
	}
	log := s.logFor(ctx).With(obs.KeyKey, key, obs.KeyToken, int64(cmd.Token), "stored_token", stored,
		obs.KeyHolder, string(cmd.Holder), "stored_holder", storedHolder,
		obs.KeyPayoutID, payoutID, obs.KeyAccountID, accountID, "op", string(cmd.Op), "actor", cmd.Actor)
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
		return problem.Fenced(key, int64(cmd.Token), stored,
			"token %d is stale for %s (fence %d); this holder no longer holds the lock", cmd.Token, key, stored).
			With("payout_id", payoutID)
	}

	s.m.rejectedTransitions.WithLabelValues(string(rej.state), string(rej.event)).Inc()
	log.Warn("rejected transition", obs.KeyEvent, pc.KindRejectedTransition, "state", string(rej.state), "event", string(rej.event))
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
