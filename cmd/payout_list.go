package cmd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

func newPayoutListCmd(a *app) *cobra.Command {
	var (
		o     payoutReader
		f     pc.PayoutFilter
		state string
		all   bool
	)
	c := &cobra.Command{
		Use:   "list [--state STATE] [--account ACCOUNT] [--limit N] [--all]",
		Short: "List payouts in id order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if state != "" {
				f.State = pc.State(strings.ToUpper(state))
				if !f.State.Valid() {
					return &ExitError{Code: 2, Err: fmt.Errorf("--state must be one of %v, got %q", pc.States, state)}
				}
			}
			if f.Limit < 1 || f.Limit > 1000 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--limit must be from 1 to 1000, got %d", f.Limit)}
			}
			cl, err := o.client()
			if err != nil {
				return err
			}
			out := []pc.Payout{}
			next := ""
			for {
				ctx, cancel := callCtx(cmd)
				page, err := cl.Payouts(ctx, f)
				cancel()
				if err != nil {
					return cliError(err)
				}
				out = append(out, page.Items...)
				next = page.Next
				if !all || page.Next == "" {
					break
				}
				f.After = page.Next
			}
			t := newTable("ID", "ACCOUNT", "AMOUNT", "CURRENCY", "STATE", "TOKEN", "FAILURE", "CREATED")
			for _, p := range out {
				t.row(p.ID, p.AccountID, strconv.FormatInt(p.Amount, 10), p.Currency, string(p.State),
					strconv.FormatInt(int64(p.Token), 10), dash(p.FailureReason), timeText(&p.CreatedAt))
			}
			if err := o.out.print(cmd.OutOrStdout(), pc.List[pc.Payout]{Items: out, Next: next}, t); err != nil {
				return err
			}
			if next != "" && !o.out.isJSON() {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --after %s (or --all)\n", next)
			}
			return nil
		},
	}
	o.register(c)
	fl := c.Flags()
	fl.StringVar(&state, "state", "", "only payouts in this state")
	fl.StringVar(&f.AccountID, "account", "", "only payouts of this account")
	fl.IntVar(&f.Limit, "limit", 100, "page size (1..1000)")
	fl.StringVar(&f.After, "after", "", "cursor: the id after which to start")
	fl.BoolVar(&all, "all", false, "follow every page")
	states := make([]string, len(pc.States))
	for i, s := range pc.States {
		states[i] = string(s)
	}
	_ = c.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(states, cobra.ShellCompDirectiveNoFileComp))
	return c
}
