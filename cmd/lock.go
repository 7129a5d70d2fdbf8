package cmd

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

func newLockCmd(a *app) *cobra.Command {
	c := &cobra.Command{Use: "lock", Short: "Operate the lock service: list, show, revoke, grants, bump-tokens"}
	c.AddCommand(
		newLockListCmd(a),
		newLockShowCmd(a),
		newLockRevokeCmd(a),
		newLockGrantsCmd(a),
		newLockBumpCmd(a),
	)
	return c
}

// lockCLI is the flags of a lock subcommand that talks to the service.
type lockCLI struct {
	cf  clientFlags
	out output
}

func (l *lockCLI) register(c *cobra.Command) {
	l.cf.register(c, "operator", lockService)
	l.out.register(c, false)
}

func (l *lockCLI) client() (*lockclient.Client, error) {
	token, hc, err := l.cf.connect()
	if err != nil {
		return nil, err
	}
	c, err := lockclient.New(l.cf.lockURL, lockclient.WithToken(token), lockclient.WithHTTPClient(hc))
	if err != nil {
		return nil, &ExitError{Code: 2, Err: fmt.Errorf("--lock-url: %w", err)}
	}
	return c, nil
}

func lockTable(locks []lockclient.LockInfo) *table {
	t := newTable("KEY", "HELD", "OWNER", "SESSION", "TOKEN", "EXPIRES", "WAITERS")
	for _, l := range locks {
		tok := "-"
		if l.Held {
			tok = l.Token.String()
		}
		t.row(l.Key, strconv.FormatBool(l.Held), dash(l.Owner), dash(l.SessionID), tok, timeText(l.ServerExpiry), strconv.Itoa(l.Waiters))
	}
	return t
}

func grantTable(recs []lockclient.GrantRecord) *table {
	t := newTable("TOKEN", "KEY", "OWNER", "SESSION", "GRANTED", "ENDED", "END_REASON", "ACTOR", "REASON")
	for _, r := range recs {
		reason := "-"
		if r.EndReason != nil {
			reason = *r.EndReason
		}
		t.row(r.Token.String(), r.Key, r.Owner, r.SessionID, timeText(&r.GrantedAt), timeText(r.EndedAt), reason, dash(r.Actor), dash(r.Reason))
	}
	return t
}

func newLockListCmd(a *app) *cobra.Command {
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
			ctx, cancel := callCtx(cmd)
			defer cancel()
			locks, err := cl.Locks(ctx, prefix)
			if err != nil {
				return cliError(err)
			}
			return l.out.print(cmd.OutOrStdout(), lockclient.LockList{Items: locks}, lockTable(locks))
		},
	}
	l.register(c)
	c.Flags().StringVar(&prefix, "prefix", "", "only keys starting with this (e.g. payout:)")
	return c
}

func newLockShowCmd(a *app) *cobra.Command {
	var l lockCLI
	c := &cobra.Command{
		Use:   "show KEY",
		Short: "Show one lock: holder, token, expiry, waiters",
		Args:  oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			info, err := cl.Lock(ctx, args[0])
			if err != nil {
				return cliError(err)
			}
			return l.out.print(cmd.OutOrStdout(), info, lockTable([]lockclient.LockInfo{info}))
		},
	}
	l.register(c)
	return c
}

func newLockRevokeCmd(a *app) *cobra.Command {
	var (
		l      lockCLI
		reason string
	)
	c := &cobra.Command{
		Use:   "revoke KEY --reason TEXT",
		Short: "Force-free a lock (operator token; audited, alerted). The holder is fenced out by the next grant's higher token",
		Args:  oneArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--reason is required")}
			}
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			rec, err := cl.Revoke(ctx, args[0], reason)
			if err != nil {
				return cliError(err)
			}
			return l.out.print(cmd.OutOrStdout(), rec, grantTable([]lockclient.GrantRecord{rec}))
		},
	}
	l.register(c)
	c.Flags().StringVar(&reason, "reason", "", "why the lock is revoked (required; recorded in the grant log)")
	return c
}

func newLockGrantsCmd(a *app) *cobra.Command {
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
			// The service's bounds: a --limit 0 was its default page
			// without a word, the others its 400 (exit 1).
			if err := checkFlagRanges(cmd, []intRange{{"limit", 1, wire.MaxLimit}, {"after", 0, int(fencing.MaxToken)}}); err != nil {
				return err
			}
			cl, err := l.client()
			if err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			page, err := cl.Grants(ctx, fencing.Token(after), limit)
			if err != nil {
				return cliError(err)
			}
			return l.out.print(cmd.OutOrStdout(), page, grantTable(page.Items))
		},
	}
	l.register(c)
	c.Flags().Int64Var(&after, "after", 0, "only grants with a token above this (0 or more)")
	c.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many (1..%d)", wire.MaxLimit))
	return c
}
