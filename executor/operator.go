package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// OperatorConfig configures the operator's payout commands.
type OperatorConfig struct {
	// Owner names the operator's lock session (e.g. operator:alice@host).
	Owner      string
	LockURL    string
	PaymentURL string
	// ProxyURL is the rail proxy, asked before a change whether the rail
	// may already hold the payout's money (see Cancel and Abandon).
	ProxyURL string
	// Token is the operator's bearer token.
	Token string
	// HTTPClient carries every call (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client
	// Wait is how long to wait for the account's lock (an executor may be
	// working on the account; it releases between payouts). 0 does not
	// wait: the lock is taken only if it is free now. Negative is an error.
	Wait time.Duration
	// SessionTTL of the short-lived session the command opens.
	SessionTTL  time.Duration
	CallTimeout time.Duration
	// Logger receives the lock session's state changes (default: discarded).
	Logger *slog.Logger

	locker locker
}

// Operator runs the operator's mutating payout commands. Each one takes the
// payout's account lock and presents the token, like any other writer
// (DESIGN D-8): an operator cannot race an executor.
type Operator struct {
	cfg  OperatorConfig
	pay  *pc.Client
	prx  *proxyclient.Client
	lock locker
}

// NewOperator builds the operator commands' client.
func NewOperator(cfg OperatorConfig) (*Operator, error) {
	if cfg.Owner == "" {
		return nil, errors.New("operator: owner is required")
	}
	if cfg.Wait < 0 {
		return nil, fmt.Errorf("operator: the wait for the account's lock must not be negative, got %s", cfg.Wait)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 15 * time.Second
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pay, err := pc.New(cfg.PaymentURL, cfg.Token, httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("--payment-url: %w", err)
	}
	prx, err := proxyclient.New(cfg.ProxyURL, cfg.Token, httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("--proxy-url: %w", err)
	}
	lk := cfg.locker
	if lk == nil {
		if lk, err = newLockService(cfg.LockURL, cfg.Token, cfg.SessionTTL, cfg.CallTimeout, cfg.Logger, cfg.HTTPClient); err != nil {
			return nil, fmt.Errorf("--lock-url: %w", err)
		}
	}
	return &Operator{cfg: cfg, pay: pay, prx: prx, lock: lk}, nil
}

// Cancel abandons a PENDING payout with reason. It is refused (conflict,
// nothing changed) when the rail proxy holds a forwarded submission of the
// payout: a PENDING payout the proxy has sent to the rail is one whose
// progress paydb lost (a restore), and cancelling it would release money
// the rail may have paid. An executor applies the proxy's record instead.
func (o *Operator) Cancel(ctx context.Context, payoutID, reason string) (pc.Payout, error) {
	return o.underLock(ctx, payoutID, reason, pc.Pending, func(rec proxyclient.Record) error {
		return problem.New(problem.Conflict,
			"payout %s was not cancelled: the rail proxy forwarded it to the rail at %s (outcome %s), so the rail may have paid it; "+
				"paydb has lost its progress (restored from a backup?): let an executor apply the proxy's record, see docs/operations.md#restoring-paydb",
			payoutID, rec.CreatedAt.UTC().Format(time.RFC3339), outcomeName(rec.Outcome))
	}, o.pay.Cancel)
}

// Abandon hands a RAIL_AMBIGUOUS payout to finance with reason. It is
// refused (conflict, nothing changed) when the rail proxy already holds the
// rail's answer for the payout, an outcome or a resolution: abandoning
// would release money the rail may have paid, where the reconciler (or an
// executor) applies the answer.
func (o *Operator) Abandon(ctx context.Context, payoutID, reason string) (pc.Payout, error) {
	return o.abandon(ctx, payoutID, reason, false)
}

// AbandonDespiteRailAnswer is Abandon for a payout whose proxy record holds
// an ACKED or REJECTED outcome the rail's own lookup contradicts: the
// reconciler leaves such a payout for a human, and this is the human's
// decision. A resolution still refuses it: the reconciler applies that.
func (o *Operator) AbandonDespiteRailAnswer(ctx context.Context, payoutID, reason string) (pc.Payout, error) {
	return o.abandon(ctx, payoutID, reason, true)
}

func (o *Operator) abandon(ctx context.Context, payoutID, reason string, despiteOutcome bool) (pc.Payout, error) {
	return o.underLock(ctx, payoutID, reason, pc.RailAmbiguous, func(rec proxyclient.Record) error {
		switch {
		case rec.Resolution != proxyclient.ResolutionNone:
			return problem.New(problem.Conflict,
				"payout %s was not abandoned: the rail proxy holds the rail's answer for it (resolution %s); "+
					"run `payouts reconcile --once` to apply it, see docs/operations.md#ambiguity-resolution", payoutID, rec.Resolution)
		case rec.Outcome.Ambiguous() || despiteOutcome:
			return nil // no answer from the rail, or one a human has overruled
		}
		return problem.New(problem.Conflict,
			"payout %s was not abandoned: the rail proxy holds the rail's answer for it (outcome %s); "+
				"run `payouts reconcile --once` to apply it; if the reconciler leaves the payout because the rail contradicts that answer, "+
				"decide with the rail's operator and abandon with --despite-rail-answer, see docs/operations.md#abandon", payoutID, outcomeName(rec.Outcome))
	}, o.pay.Abandon)
}

// forwarded is the proxy's forwarded submission of the payout, if it has
// one (FENCED attempts were never sent and do not count). It reads every
// attempt, whose answer is a list even when there is none: a 404 is then
// never "no submission" but a wrong --proxy-url, and refuses the change.
func (o *Operator) forwarded(ctx context.Context, payoutID string) (proxyclient.Record, bool, error) {
	recs, err := o.prx.GetAll(ctx, payoutID)
	if err != nil {
		return proxyclient.Record{}, false, fmt.Errorf("ask the rail proxy whether payout %s was sent to the rail (nothing was changed): %w", payoutID, err)
	}
	for _, rec := range recs {
		if rec.Outcome != proxyclient.OutcomeFenced {
			return rec, true, nil
		}
	}
	return proxyclient.Record{}, false, nil
}

// outcomeName is how a message names an outcome; none yet reads "null".
func outcomeName(o proxyclient.Outcome) string {
	if o == proxyclient.OutcomeNone {
		return "null"
	}
	return string(o)
}

// underLock makes a change to a payout that releases its money (change:
// the payment resource's cancel or abandon) under its account's grant. If
// the payout, read again under the grant, is in the state the change is
// for (from) and the rail proxy has forwarded it, refuse says whether the
// proxy's record forbids the change (nil: it does not). A payout in any
// other state is left to the payment resource, which refuses the change as
// an invalid transition and records the defect signal.
func (o *Operator) underLock(ctx context.Context, payoutID, reason string, from pc.State, refuse func(proxyclient.Record) error,
	change func(context.Context, string, fencing.Token, fencing.Holder, string) (pc.Payout, error)) (pc.Payout, error) {
	if strings.TrimSpace(reason) == "" {
		return pc.Payout{}, problem.New(problem.InvalidRequest, "reason: required (--reason)")
	}
	p, err := o.pay.Payout(ctx, payoutID)
	if err != nil {
		return pc.Payout{}, err
	}
	sess, err := o.lock.Open(ctx, o.cfg.Owner)
	if err != nil {
		return pc.Payout{}, fmt.Errorf("open a lock session: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cfg.CallTimeout)
		defer cancel()
		_ = sess.Close(cctx) // releases the grant too
	}()
	g, err := sess.Acquire(ctx, fencing.Key(p.AccountID), o.cfg.Wait)
	if err != nil {
		return pc.Payout{}, fmt.Errorf("take %s: %w", fencing.Key(p.AccountID), err)
	}
	lost := func() error {
		if g.Valid() {
			return nil
		}
		return fmt.Errorf("the grant on %s was lost (or its lock session is in jeopardy) before the change could be made; nothing was changed", g.Key())
	}
	if err := lost(); err != nil {
		return pc.Payout{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, o.cfg.CallTimeout)
	defer cancel()
	// The payout as it stands under the grant, which decides what to ask
	// the proxy (an executor may have moved it while the command waited).
	if p, err = o.pay.Payout(cctx, payoutID); err != nil {
		return pc.Payout{}, err // closing the session ends the grant
	}
	if p.State == from {
		rec, found, err := o.forwarded(cctx, payoutID)
		if err != nil {
			return pc.Payout{}, err
		}
		if found {
			if err := refuse(rec); err != nil {
				return pc.Payout{}, err
			}
		}
	}
	// The reads above can outlive the grant (D-11): checked again right
	// before the change.
	if err := lost(); err != nil {
		return pc.Payout{}, err
	}
	out, err := change(cctx, payoutID, g.Token(), g.Holder(), reason)
	// A failed release is harmless: closing the session ends the grant too.
	_ = g.Release(context.WithoutCancel(cctx))
	return out, err
}
