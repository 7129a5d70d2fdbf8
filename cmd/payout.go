package cmd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

func newPayoutCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "payout",
		Short: "Operator commands on payouts: create, show, list, cancel, abandon",
		Long: "Operator commands on payouts. cancel and abandon take the account's lock (payout:{account})\n" +
			"and present its fencing token like any other writer, so they never race an executor.",
	}
	c.AddCommand(
		newPayoutCreateCmd(a),
		newPayoutShowCmd(a),
		newPayoutListCmd(a),
		newPayoutChangeCmd(a, "cancel", "Cancel a PENDING payout (it becomes ABANDONED); requires --reason"),
		newPayoutChangeCmd(a, "abandon", "Hand a RAIL_AMBIGUOUS payout to finance (it becomes ABANDONED); requires --reason"),
	)
	return c
}

// payoutReader is the flags of a payout command that only calls the
// payment resource.
type payoutReader struct {
	cf  clientFlags
	out output
}

func (o *payoutReader) register(c *cobra.Command) {
	o.cf.register(c, "operator", paymentService)
	o.out.register(c, false)
}

func (o *payoutReader) client() (*pc.Client, error) {
	token, hc, err := o.cf.connect()
	if err != nil {
		return nil, err
	}
	c, err := pc.New(o.cf.paymentURL, token, httpx.WithHTTPClient(hc))
	if err != nil {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("--payment-url: %w", err)}
	}
	return c, nil
}

func newPayoutCreateCmd(a *app) *cobra.Command {
	var (
		o   payoutReader
		req pc.CreatePayoutRequest
	)
	c := &cobra.Command{
		Use:   "create --id ID --account ACCOUNT --amount MINOR_UNITS --currency CUR --beneficiary REF",
		Short: "Create a PENDING payout (idempotent on --id)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, f := range []struct{ name, v string }{{"id", req.ID}, {"account", req.AccountID}, {"currency", req.Currency}, {"beneficiary", req.BeneficiaryRef}} {
				if strings.TrimSpace(f.v) == "" {
					return &ExitError{Code: 2, Err: fmt.Errorf("--%s is required", f.name)}
				}
			}
			if err := checkFlagRanges(cmd, []intRange{{"amount", 1, int(wire.MaxAmount - 1)}}); err != nil {
				return err
			}
			cl, err := o.client()
			if err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			p, err := cl.CreatePayout(ctx, req)
			if err != nil {
				return cliError(err)
			}
			return o.out.print(cmd.OutOrStdout(), p, payoutDetail(p))
		},
	}
	o.register(c)
	fl := c.Flags()
	fl.StringVar(&req.ID, "id", "", "payout id (idempotency key)")
	fl.StringVar(&req.AccountID, "account", "", "account to pay out from")
	fl.Int64Var(&req.Amount, "amount", 0, fmt.Sprintf("amount in minor units (1 .. %d)", wire.MaxAmount-1))
	fl.StringVar(&req.Currency, "currency", "EUR", "currency (the payment resource's one currency)")
	fl.StringVar(&req.BeneficiaryRef, "beneficiary", "", "opaque beneficiary reference")
	return c
}

func newPayoutShowCmd(a *app) *cobra.Command {
	var (
		o      payoutReader
		events bool
	)
	c := &cobra.Command{
		Use:               "show PAYOUT_ID",
		Short:             "Show one payout (with --events: its state history)",
		Args:              oneArg,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			p, err := cl.Payout(ctx, args[0])
			if err != nil {
				return cliError(err)
			}
			w := cmd.OutOrStdout()
			if !events {
				return o.out.print(w, p, payoutDetail(p))
			}
			evs := []pc.PayoutEvent{}
			var after int64
			for {
				page, err := cl.PayoutEvents(ctx, p.ID, after, 1000)
				if err != nil {
					return cliError(err)
				}
				evs = append(evs, page.Items...)
				if page.Next == "" || len(page.Items) == 0 {
					break
				}
				after = page.Items[len(page.Items)-1].ID
			}
			t := payoutDetail(p).row().row("AT", "FROM", "TO", "TOKEN", "HOLDER", "ACTOR", "REASON")
			for _, e := range evs {
				t.row(e.At.UTC().Format(time.RFC3339), dash(string(e.FromState)), string(e.ToState),
					strconv.FormatInt(int64(e.Token), 10), dash(string(e.Holder)), e.Actor, e.Reason)
			}
			return o.out.print(w, struct {
				Payout pc.Payout        `json:"payout"`
				Events []pc.PayoutEvent `json:"events"`
			}{p, evs}, t)
		},
	}
	o.register(c)
	c.Flags().BoolVar(&events, "events", false, "also show the payout's state history")
	return c
}

// payoutDetail is one payout as a two-column table.
func payoutDetail(p pc.Payout) *table {
	return newTable().
		row("id", p.ID).row("account", p.AccountID).row("amount", strconv.FormatInt(p.Amount, 10)+" "+p.Currency).
		row("beneficiary", p.BeneficiaryRef).row("state", string(p.State)).row("client_ref", p.ClientRef).
		row("claimed_by", dash(string(p.ClaimedBy))).row("token", strconv.FormatInt(int64(p.Token), 10)).
		row("failure_reason", dash(p.FailureReason)).row("rail_ref", dash(p.RailRef)).row("error_code", dash(p.ErrorCode)).
		row("created_at", timeText(&p.CreatedAt)).row("claimed_at", timeText(p.ClaimedAt)).
		row("submitted_at", timeText(p.SubmittedAt)).row("settled_at", timeText(p.SettledAt))
}

// callCtx bounds one operator command's calls.
func callCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), 30*time.Second)
}

// cliError keeps a problem's code visible to the operator; a refused
// credential exits 2, like every client role.
func cliError(err error) error {
	var pe *problem.Error
	if !errors.As(err, &pe) {
		return err
	}
	code := 1
	if pe.Code == problem.Unauthorized || pe.Code == problem.Forbidden {
		code = 2
	}
	return &ExitError{Code: code, Err: fmt.Errorf("%s (HTTP %d): %s", pe.Code, pe.Status(), pe.Message)}
}
