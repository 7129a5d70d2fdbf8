package cmd

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/executor"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// newPayoutChangeCmd is cancel or abandon: a fenced write under the
// account's lock, like any other writer's.
func newPayoutChangeCmd(a *app, verb, short string) *cobra.Command {
	var (
		cf     clientFlags
		out    output
		reason string
		owner  string
		wait   time.Duration
		// despite: abandon overrules the rail's answer the proxy recorded.
		despite bool
	)
	c := &cobra.Command{
		Use:               verb + " PAYOUT_ID --reason TEXT",
		Short:             short,
		Args:              oneArg,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &ExitError{Code: 2, Err: errors.New("--reason is required: say why, it is kept in the audit trail")}
			}
			if wait < 0 || wait > backend.MaxWait {
				return &ExitError{Code: 2, Err: fmt.Errorf("--wait must be from 0 (take the lock only if it is free now) to %s (the lock service's longest wait), got %s", backend.MaxWait, wait)}
			}
			token, hc, err := cf.connect()
			if err != nil {
				return err
			}
			if owner == "" {
				host, _ := os.Hostname()
				user := os.Getenv("USER")
				if user == "" {
					user = "unknown"
				}
				owner = fmt.Sprintf("operator:%s@%s", user, host)
			}
			op, err := executor.NewOperator(executor.OperatorConfig{
				Owner: owner, LockURL: cf.lockURL, PaymentURL: cf.paymentURL, ProxyURL: cf.proxyURL, Token: token, HTTPClient: hc, Wait: wait,
			})
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			do := op.Cancel
			switch {
			case verb == "abandon" && despite:
				do = op.AbandonDespiteRailAnswer
			case verb == "abandon":
				do = op.Abandon
			}
			p, err := do(cmd.Context(), args[0], reason)
			if problem.Has(err, problem.LockHeld) {
				return lockHeldError(err, wait)
			}
			if err != nil {
				return cliError(err)
			}
			return out.print(cmd.OutOrStdout(), p, payoutDetail(p))
		},
	}
	cf.register(c, "operator", lockService, paymentService, proxyService)
	out.register(c, false)
	fl := c.Flags()
	fl.StringVar(&reason, "reason", "", "why (required; recorded in the payout's history)")
	fl.StringVar(&owner, "owner", "", "name of this operator in the lock service (default operator:$USER@HOST)")
	fl.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the account's lock (0: take it only if it is free now; at most "+backend.MaxWait.String()+")")
	if verb == "abandon" {
		fl.BoolVar(&despite, "despite-rail-answer", false, "abandon even though the rail proxy recorded an ACKED or REJECTED answer, which the rail's own lookup contradicts (the reconciler left the payout for a human); say why in --reason")
	}
	return c
}

// lockHeldError is a lock_held answer to the account's lock as the
// operator can act on it: who holds the lock (the problem's holder, its
// session and when its lease ends, when the lock service sent them), and
// that the lock may be waited for. It was "lock_held ... held by another
// session", the holder dropped.
func lockHeldError(err error, waited time.Duration) error {
	pe := problem.From(err)
	msg := fmt.Sprintf("%s (HTTP %d): %s", pe.Code, pe.Status(), pe.Message)
	var holder, session string
	var expiry time.Time
	var held []string
	if pe.Extension("holder", &holder) && holder != "" {
		held = append(held, "by "+holder)
	}
	if pe.Extension("holder_session_id", &session) && session != "" {
		held = append(held, "session "+session)
	}
	if pe.Extension("server_expiry", &expiry) && !expiry.IsZero() {
		held = append(held, "lease until "+expiry.UTC().Format(time.RFC3339))
	}
	if len(held) > 0 {
		msg += " (" + strings.Join(held, ", ") + ")"
	}
	msg += fmt.Sprintf("; waited %s for it: run again with a longer --wait (at most %s) — an executor keeps an account's lock for its --grant-linger (default %s) after the account's work runs out",
		waited, backend.MaxWait, executor.DefaultGrantLinger)
	return &ExitError{Code: 1, Err: errors.New(msg)}
}
