package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/executor"
	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

func init() {
	register(func(root, serve, run, dev *cobra.Command) { root.AddCommand(newPayoutCmd()) })
}

// payoutCLI holds the flags every payout subcommand shares.
type payoutCLI struct {
	cf     clientFlags
	output string
}

func (o *payoutCLI) register(c *cobra.Command) {
	o.cf.register(c)
	c.Flags().StringVarP(&o.output, "output", "o", "table", "output format: table or json")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
}

func (o *payoutCLI) check() error {
	if o.output != "table" && o.output != "json" {
		return &ExitError{Code: 2, Err: fmt.Errorf("--output must be table or json, got %q", o.output)}
	}
	if o.cf.token == "" {
		return &ExitError{Code: 2, Err: fmt.Errorf("--token (or %s) is required: the operator's bearer token", EnvName("token"))}
	}
	return nil
}

func (o *payoutCLI) client() (*pc.Client, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	c, err := pc.New(o.cf.paymentURL, o.cf.token)
	if err != nil {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("--payment-url: %w", err)}
	}
	return c, nil
}

func newPayoutCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "payout",
		Short: "Operator commands on payouts: create, show, list, cancel, abandon",
		Long: "Operator commands on payouts. cancel and abandon take the account's lock (payout:{account})\n" +
			"and present its fencing token like any other writer, so they never race an executor.",
	}
	c.AddCommand(newPayoutCreateCmd(), newPayoutShowCmd(), newPayoutListCmd(),
		newPayoutChangeCmd("cancel", "Cancel a PENDING payout (it becomes ABANDONED); requires --reason"),
		newPayoutChangeCmd("abandon", "Hand a RAIL_AMBIGUOUS payout to finance (it becomes ABANDONED); requires --reason"))
	return c
}

func newPayoutCreateCmd() *cobra.Command {
	var (
		o   payoutCLI
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
			if req.Amount <= 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--amount must be a positive integer in minor units, got %d", req.Amount)}
			}
			cl, err := o.client()
			if err != nil {
				return err
			}
			p, err := cl.CreatePayout(cmd.Context(), req)
			if err != nil {
				return cliError(err)
			}
			return o.printPayouts(cmd.OutOrStdout(), []pc.Payout{p}, true)
		},
	}
	o.register(c)
	fl := c.Flags()
	fl.StringVar(&req.ID, "id", "", "payout id (idempotency key)")
	fl.StringVar(&req.AccountID, "account", "", "account to pay out from")
	fl.Int64Var(&req.Amount, "amount", 0, "amount in minor units")
	fl.StringVar(&req.Currency, "currency", "EUR", "currency (the payment resource's one currency)")
	fl.StringVar(&req.BeneficiaryRef, "beneficiary", "", "opaque beneficiary reference")
	return c
}

func newPayoutShowCmd() *cobra.Command {
	var (
		o      payoutCLI
		events bool
	)
	c := &cobra.Command{
		Use:               "show PAYOUT_ID",
		Short:             "Show one payout (with --events: its state history)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := o.client()
			if err != nil {
				return err
			}
			p, err := cl.Payout(cmd.Context(), args[0])
			if err != nil {
				return cliError(err)
			}
			if !events {
				return o.printPayouts(cmd.OutOrStdout(), []pc.Payout{p}, true)
			}
			var evs []pc.PayoutEvent
			var after int64
			for {
				page, err := cl.PayoutEvents(cmd.Context(), p.ID, after, 1000)
				if err != nil {
					return cliError(err)
				}
				evs = append(evs, page.Items...)
				if page.Next == "" || len(page.Items) == 0 {
					break
				}
				after = page.Items[len(page.Items)-1].ID
			}
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), struct {
					Payout pc.Payout        `json:"payout"`
					Events []pc.PayoutEvent `json:"events"`
				}{p, evs})
			}
			if err := o.printPayouts(cmd.OutOrStdout(), []pc.Payout{p}, true); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout())
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tFROM\tTO\tTOKEN\tHOLDER\tACTOR\tREASON")
			for _, e := range evs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.At.Format(time.RFC3339), dash(string(e.FromState)), e.ToState,
					e.Token, dash(string(e.Holder)), e.Actor, e.Reason)
			}
			return tw.Flush()
		},
	}
	o.register(c)
	c.Flags().BoolVar(&events, "events", false, "also show the payout's state history")
	return c
}

func newPayoutListCmd() *cobra.Command {
	var (
		o     payoutCLI
		f     pc.PayoutFilter
		state string
		all   bool
		limit int
		after string
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
			if limit < 1 || limit > 1000 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--limit must be from 1 to 1000, got %d", limit)}
			}
			cl, err := o.client()
			if err != nil {
				return err
			}
			f.Limit, f.After = limit, after
			var out []pc.Payout
			next := ""
			for {
				page, err := cl.Payouts(cmd.Context(), f)
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
			if o.output == "json" {
				return writeJSON(cmd.OutOrStdout(), pc.List[pc.Payout]{Items: nonNilPayouts(out), Next: next})
			}
			if err := o.printPayouts(cmd.OutOrStdout(), out, false); err != nil {
				return err
			}
			if next != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --after %s (or --all)\n", next)
			}
			return nil
		},
	}
	o.register(c)
	fl := c.Flags()
	fl.StringVar(&state, "state", "", "only payouts in this state")
	fl.StringVar(&f.AccountID, "account", "", "only payouts of this account")
	fl.IntVar(&limit, "limit", 100, "page size (1..1000)")
	fl.StringVar(&after, "after", "", "cursor: the id after which to start")
	fl.BoolVar(&all, "all", false, "follow every page")
	states := make([]string, len(pc.States))
	for i, s := range pc.States {
		states[i] = string(s)
	}
	_ = c.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(states, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newPayoutChangeCmd(verb, short string) *cobra.Command {
	var (
		o      payoutCLI
		reason string
		owner  string
		wait   time.Duration
	)
	c := &cobra.Command{
		Use:               verb + " PAYOUT_ID --reason TEXT",
		Short:             short,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return &ExitError{Code: 2, Err: errors.New("--reason is required: say why, it is kept in the audit trail")}
			}
			if err := o.check(); err != nil {
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
				Owner: owner, LockURL: o.cf.lockURL, PaymentURL: o.cf.paymentURL, Token: o.cf.token, Wait: wait,
			})
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			do := op.Cancel
			if verb == "abandon" {
				do = op.Abandon
			}
			p, err := do(cmd.Context(), args[0], reason)
			if err != nil {
				return cliError(err)
			}
			return o.printPayouts(cmd.OutOrStdout(), []pc.Payout{p}, true)
		},
	}
	o.register(c)
	fl := c.Flags()
	fl.StringVar(&reason, "reason", "", "why (required; recorded in the payout's history)")
	fl.StringVar(&owner, "owner", "", "name of this operator in the lock service (default operator:$USER@HOST)")
	fl.DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the account's lock")
	return c
}

// cliError keeps a problem's code visible to the operator.
func cliError(err error) error {
	var pe *problem.Error
	if errors.As(err, &pe) {
		return fmt.Errorf("%s (HTTP %d): %s", pe.Code, pe.Status(), pe.Message)
	}
	return err
}

func nonNilPayouts(p []pc.Payout) []pc.Payout {
	if p == nil {
		return []pc.Payout{}
	}
	return p
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (o *payoutCLI) printPayouts(w io.Writer, ps []pc.Payout, single bool) error {
	if o.output == "json" {
		if single && len(ps) == 1 {
			return writeJSON(w, ps[0])
		}
		return writeJSON(w, nonNilPayouts(ps))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if single && len(ps) == 1 {
		p := ps[0]
		rows := [][2]string{
			{"id", p.ID}, {"account", p.AccountID}, {"amount", strconv.FormatInt(p.Amount, 10) + " " + p.Currency},
			{"beneficiary", p.BeneficiaryRef}, {"state", string(p.State)}, {"client_ref", p.ClientRef},
			{"claimed_by", dash(string(p.ClaimedBy))}, {"token", strconv.FormatInt(int64(p.Token), 10)},
			{"failure_reason", dash(p.FailureReason)}, {"rail_ref", dash(p.RailRef)}, {"error_code", dash(p.ErrorCode)},
			{"created_at", p.CreatedAt.Format(time.RFC3339)}, {"claimed_at", timeText(p.ClaimedAt)},
			{"submitted_at", timeText(p.SubmittedAt)}, {"settled_at", timeText(p.SettledAt)},
		}
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "ID\tACCOUNT\tAMOUNT\tCURRENCY\tSTATE\tTOKEN\tFAILURE\tCREATED")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", p.ID, p.AccountID, p.Amount, p.Currency, p.State,
			p.Token, dash(p.FailureReason), p.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

func timeText(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
