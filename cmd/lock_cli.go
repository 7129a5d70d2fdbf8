package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/lock"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	"github.com/payouts/payouts/lock/pgbackend"
)

func init() {
	register(func(root, serve, run, dev *cobra.Command) { root.AddCommand(newLockCmd()) })
}

func newLockCmd() *cobra.Command {
	c := &cobra.Command{Use: "lock", Short: "Operate the lock service: list, show, revoke, bump-tokens, grants"}
	c.AddCommand(newLockListCmd(), newLockShowCmd(), newLockRevokeCmd(), newLockBumpCmd(), newLockGrantsCmd())
	return c
}

// lockCLI holds the flags every lock subcommand that talks to the service takes.
type lockCLI struct {
	cf     clientFlags
	output string
}

func (l *lockCLI) register(c *cobra.Command) {
	l.cf.register(c)
	c.Flags().StringVar(&l.output, "output", "table", "output format: table or json")
}

func (l *lockCLI) client() (*lockclient.Client, error) {
	if l.output != "table" && l.output != "json" {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("--output must be table or json, got %q", l.output)}
	}
	c, err := lockclient.New(l.cf.lockURL, lockclient.WithToken(l.cf.token))
	if err != nil {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("--lock-url: %w", err)}
	}
	return c, nil
}

func lockCtx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), 30*time.Second)
}

func lockWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func lockFmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func lockWriteLocks(w io.Writer, locks []lockclient.LockInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHELD\tOWNER\tSESSION\tTOKEN\tEXPIRES\tWAITERS")
	for _, l := range locks {
		tok := "-"
		if l.Held {
			tok = l.Token.String()
		}
		fmt.Fprintf(tw, "%s\t%t\t%s\t%s\t%s\t%s\t%d\n", l.Key, l.Held, lockDash(l.Owner), lockDash(l.SessionID), tok, lockFmtTime(l.ServerExpiry), l.Waiters)
	}
	return tw.Flush()
}

func lockDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newLockListCmd() *cobra.Command {
	var (
		l      lockCLI
		prefix string
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List held locks (introspection: may be stale by the time it prints)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := lockCtx(cmd)
			defer cancel()
			locks, err := cl.Locks(ctx, prefix)
			if err != nil {
				return err
			}
			if l.output == "json" {
				return lockWriteJSON(cmd.OutOrStdout(), lockclient.LockList{Items: locks})
			}
			return lockWriteLocks(cmd.OutOrStdout(), locks)
		},
	}
	l.register(c)
	c.Flags().StringVar(&prefix, "prefix", "", "only keys starting with this (e.g. payout:)")
	return c
}

func newLockShowCmd() *cobra.Command {
	var l lockCLI
	c := &cobra.Command{
		Use:   "show KEY",
		Short: "Show one lock: holder, token, expiry, waiters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := lockCtx(cmd)
			defer cancel()
			info, err := cl.Lock(ctx, args[0])
			if err != nil {
				return err
			}
			if l.output == "json" {
				return lockWriteJSON(cmd.OutOrStdout(), info)
			}
			return lockWriteLocks(cmd.OutOrStdout(), []lockclient.LockInfo{info})
		},
	}
	l.register(c)
	return c
}

func lockWriteGrants(w io.Writer, recs []lockclient.GrantRecord) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tKEY\tOWNER\tSESSION\tGRANTED\tENDED\tEND_REASON\tACTOR\tREASON")
	for _, r := range recs {
		reason := "-"
		if r.EndReason != nil {
			reason = *r.EndReason
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Token, r.Key, r.Owner, r.SessionID,
			lockFmtTime(&r.GrantedAt), lockFmtTime(r.EndedAt), reason, lockDash(r.Actor), lockDash(r.Reason))
	}
	return tw.Flush()
}

func newLockRevokeCmd() *cobra.Command {
	var (
		l      lockCLI
		reason string
	)
	c := &cobra.Command{
		Use:   "revoke KEY --reason TEXT",
		Short: "Force-free a lock (operator token; audited, alerted). The holder is fenced out by the next grant's higher token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--reason is required")}
			}
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := lockCtx(cmd)
			defer cancel()
			rec, err := cl.Revoke(ctx, args[0], reason)
			if err != nil {
				return err
			}
			if l.output == "json" {
				return lockWriteJSON(cmd.OutOrStdout(), rec)
			}
			return lockWriteGrants(cmd.OutOrStdout(), []lockclient.GrantRecord{rec})
		},
	}
	l.register(c)
	c.Flags().StringVar(&reason, "reason", "", "why the lock is revoked (required; recorded in the grant log)")
	return c
}

func newLockGrantsCmd() *cobra.Command {
	var (
		l     lockCLI
		after int64
		limit int
	)
	c := &cobra.Command{
		Use:   "grants",
		Short: "Print the grant log (every grant, how it ended) after a token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := lockCtx(cmd)
			defer cancel()
			page, err := cl.Grants(ctx, fencing.Token(after), limit)
			if err != nil {
				return err
			}
			if l.output == "json" {
				return lockWriteJSON(cmd.OutOrStdout(), page)
			}
			return lockWriteGrants(cmd.OutOrStdout(), page.Items)
		},
	}
	l.register(c)
	c.Flags().Int64Var(&after, "after", 0, "only grants with a token above this")
	c.Flags().IntVar(&limit, "limit", 100, "at most this many (1..1000)")
	return c
}

func newLockBumpCmd() *cobra.Command {
	var (
		to         int64
		url        string
		output     string
		fromGuards bool
		margin     int64
		guards     = []lock.Guard{{Name: "payment"}, {Name: "proxy"}}
	)
	c := &cobra.Command{
		Use:   "bump-tokens (--to N | --from-guards) --database-url URL",
		Short: "After restoring lockdb or promoting a replica (PostgreSQL backend), make every future token greater than N (D-13); never moves tokens down",
		Long: "After restoring lockdb from a backup, or promoting an asynchronous replica of it, run this before the\n" +
			"lock service grants again: with --to N, N at or above the highest fence either guard has stored\n" +
			"(payouts reconcile prints it); with --from-guards, it reads both guards' GET /v1/fences/high itself\n" +
			"and bumps to the larger plus --margin. It refuses to move the token sequence down. For the etcd\n" +
			"backend use etcdutl snapshot restore --bump-revision instead.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--output must be table or json, got %q", output)}
			}
			if url == "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--database-url (or %s) is required: bump-tokens acts on lockdb directly", EnvName("database-url"))}
			}
			if fromGuards == (to != 0) {
				return &ExitError{Code: 2, Err: fmt.Errorf("give exactly one of --to N and --from-guards")}
			}
			if !fromGuards && to <= 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--to must be a positive token")}
			}
			if margin < 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--margin must not be negative")}
			}
			ctx, cancel := lockCtx(cmd)
			defer cancel()
			var fences []lock.GuardFence
			if fromGuards {
				var err error
				if fences, err = lock.GuardsHighFence(ctx, guards); err != nil {
					return err
				}
				t, err := lock.BumpTarget(fences, margin)
				if err != nil {
					return err
				}
				to = int64(t)
			}
			from, err := pgbackend.BumpTokens(ctx, url, fencing.Token(to))
			if err != nil {
				return err
			}
			out := struct {
				From   fencing.Token     `json:"from"`
				To     fencing.Token     `json:"to"`
				Guards []lock.GuardFence `json:"guards,omitempty"`
			}{from, fencing.Token(max(to, int64(from))), fences}
			if output == "json" {
				return lockWriteJSON(cmd.OutOrStdout(), out)
			}
			for _, f := range fences {
				fmt.Fprintf(cmd.OutOrStdout(), "%s guard %s: highest fence %s\n", f.Guard, f.URL, f.Token)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tokens bumped: highest issued was %s; every future token is above %s\n",
				strconv.FormatInt(int64(out.From), 10), strconv.FormatInt(int64(out.To), 10))
			return nil
		},
	}
	c.Flags().Int64Var(&to, "to", 0, "every future token will be greater than this")
	c.Flags().BoolVar(&fromGuards, "from-guards", false, "read both guards' highest fence (GET /v1/fences/high) and bump above the larger plus --margin")
	c.Flags().Int64Var(&margin, "margin", 1000, "with --from-guards: how far above the guards' highest fence to bump")
	c.Flags().StringVar(&guards[0].URL, "payment-url", "http://127.0.0.1:7102", "with --from-guards: payment resource URL")
	c.Flags().StringVar(&guards[0].Token, "payment-token", "", "with --from-guards: bearer token for the payment resource")
	c.Flags().StringVar(&guards[1].URL, "proxy-url", "http://127.0.0.1:7103", "with --from-guards: rail proxy URL")
	c.Flags().StringVar(&guards[1].Token, "proxy-token", "", "with --from-guards: bearer token for the rail proxy")
	c.Flags().StringVar(&url, "database-url", "", "PostgreSQL URL of lockdb")
	c.Flags().StringVar(&output, "output", "table", "output format: table or json")
	return c
}
