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
)

// OperatorConfig configures the operator's payout commands.
type OperatorConfig struct {
	// Owner names the operator's lock session (e.g. operator:alice@host).
	Owner      string
	LockURL    string
	PaymentURL string
	// Token is the operator's bearer token.
	Token string
	// HTTPClient carries every call (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client
	// Wait is how long to wait for the account's lock (an executor may be
	// working on the account; it releases between payouts).
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
	lock locker
}

// NewOperator builds the operator commands' client.
func NewOperator(cfg OperatorConfig) (*Operator, error) {
	if cfg.Owner == "" {
		return nil, errors.New("operator: owner is required")
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
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
	lk := cfg.locker
	if lk == nil {
		if lk, err = newLockService(cfg.LockURL, cfg.Token, cfg.SessionTTL, cfg.CallTimeout, cfg.Logger, cfg.HTTPClient); err != nil {
			return nil, fmt.Errorf("--lock-url: %w", err)
		}
	}
	return &Operator{cfg: cfg, pay: pay, lock: lk}, nil
}

// Cancel abandons a PENDING payout with reason.
func (o *Operator) Cancel(ctx context.Context, payoutID, reason string) (pc.Payout, error) {
	return o.underLock(ctx, payoutID, reason, func(ctx context.Context, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return o.pay.Cancel(ctx, payoutID, tok, h, reason)
	})
}

// Abandon hands a RAIL_AMBIGUOUS payout to finance with reason.
func (o *Operator) Abandon(ctx context.Context, payoutID, reason string) (pc.Payout, error) {
	return o.underLock(ctx, payoutID, reason, func(ctx context.Context, tok fencing.Token, h fencing.Holder) (pc.Payout, error) {
		return o.pay.Abandon(ctx, payoutID, tok, h, reason)
	})
}

func (o *Operator) underLock(ctx context.Context, payoutID, reason string,
	act func(context.Context, fencing.Token, fencing.Holder) (pc.Payout, error)) (pc.Payout, error) {
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
	if !g.Valid() {
		return pc.Payout{}, fmt.Errorf("the grant on %s was lost before the change could be made; nothing was changed", g.Key())
	}
	cctx, cancel := context.WithTimeout(ctx, o.cfg.CallTimeout)
	defer cancel()
	out, err := act(cctx, g.Token(), g.Holder())
	// A failed release is harmless: closing the session ends the grant too.
	_ = g.Release(context.WithoutCancel(cctx))
	return out, err
}
