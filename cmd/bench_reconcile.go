package cmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/dev/bench"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/rail"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/reconcile"
)

func newBenchReconcileCmd(a *app) *cobra.Command {
	var (
		opts bench.ReconcileOptions
		out  output
	)
	c := &cobra.Command{
		Use:   "reconcile",
		Short: "Load N terminal payouts in bulk into a throwaway stack and time one `payouts reconcile --once` pass",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// --per-grant 0 became 50 without a word.
			if err := checkFlagRanges(cmd, []intRange{{"payouts", 1, math.MaxInt}, {"per-grant", 1, math.MaxInt}}); err != nil {
				return err
			}
			opts.Logger = a.logger(cmd, "bench")
			if err := wireBenchReconcile(&opts); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			res, err := bench.Reconcile(cmd.Context(), opts)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if out.isJSON() {
				b, _ := json.Marshal(res)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "payouts %d (accounts %d, loaded in %.1f s)\npass    %.2f s (%.0f payouts/s), exit %d\nfindings %d\npeak RSS %.1f MB\n",
				res.Payouts, res.Accounts, res.LoadSeconds, res.Seconds, float64(res.Payouts)/res.Seconds, res.ExitCode, res.Findings, res.PeakRSSMB)
			return nil
		},
	}
	fl := c.Flags()
	fl.IntVar(&opts.Payouts, "payouts", 10_000, "terminal payouts to load")
	fl.IntVar(&opts.PerGrant, "per-grant", 50, "payouts per account (one grant each)")
	fl.StringVar(&opts.Dir, "dir", "", "directory of the throwaway stack (default: a temporary one, removed afterwards)")
	fl.BoolVar(&opts.RailPerPayout, "rail-per-payout", false, "run the pass with --rail-per-payout (flat memory; the rail is asked per payout)")
	fl.StringArrayVar(&opts.ReconcileArgs, "reconcile-arg", nil, "extra flag for the measured reconcile pass, e.g. --reconcile-arg=--page-size=500 (repeatable)")
	fl.StringVar(&opts.CPUProfile, "cpu-profile", "", "run the pass in this process and write its CPU profile (pprof) to this file")
	out.register(c, true)
	return c
}

// wireBenchReconcile gives the bench the roles it runs in this process: a
// rail stub (its payments live in memory) and, for --cpu-profile, the
// reconciler itself.
func wireBenchReconcile(opts *bench.ReconcileOptions) error {
	var toks [3]string
	for i := range toks {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		toks[i] = hex.EncodeToString(b)
	}
	// The loader pays as the proxy would; the reconciler is given its rail
	// credentials explicitly: a reconciler-role one for lookups and an
	// operator-role one for the settlement report.
	opts.RailPayToken, opts.RailLookupToken, opts.RailReportToken = toks[0], toks[1], toks[2]
	opts.NewRail = func() (http.Handler, error) {
		a, err := auth.Parse([]byte(fmt.Sprintf(`{"tokens":[{"token":%q,"role":"proxy","name":"bench-proxy"},`+
			`{"token":%q,"role":"reconciler","name":"bench-reconciler"},{"token":%q,"role":"operator","name":"bench-operator"}]}`,
			opts.RailPayToken, opts.RailLookupToken, opts.RailReportToken)))
		if err != nil {
			return nil, err
		}
		srv, err := rail.New(rail.Config{Logger: slog.New(slog.DiscardHandler), Registry: obs.NewRegistry(), Auth: a, Faults: railclient.DefaultFaults()})
		if err != nil {
			return nil, err
		}
		return srv.Handler(), nil
	}
	opts.EtcdPrefix = etcdbackend.DefaultPrefix
	opts.InProcessPass = func(ctx context.Context, u bench.PassURLs) ([]byte, int, error) {
		var out bytes.Buffer
		code, err := reconcile.Run(ctx, reconcile.Config{LockURL: u.LockURL, PaymentURL: u.PaymentURL, ProxyURL: u.ProxyURL, RailURL: u.RailURL,
			Token: u.Token, RailToken: u.RailToken, RailReportToken: u.RailReportToken, Once: true, JSON: true, Out: &out, Logger: slog.New(slog.DiscardHandler),
			Options: reconcile.Options{Resolve: true, Owner: "bench", RailPerPayout: u.RailPerPayout}})
		return out.Bytes(), code, err
	}
	return nil
}
