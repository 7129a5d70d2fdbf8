package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/dev/bench"
	"github.com/payouts/payouts/dev/stack"
)

func newBenchE2ECmd(a *app) *cobra.Command {
	var (
		o    bench.E2EOptions
		out  output
		plot string
	)
	c := &cobra.Command{
		Use:   "e2e",
		Short: "Payouts end to end: load accounts and payouts, run executors, wait until every payout is terminal",
		Long: `bench e2e starts a throwaway local stack (as dev up does; or uses --payment-urls and friends),
loads --accounts accounts, runs --executors executor processes, creates --payouts payouts through
the API (at --rate per second; 0: as fast as the loaders go) and waits until every payout is
terminal. It prints payouts/s (first created to last terminal), p50/p99 latency from created to
terminal, CPU seconds per 1,000 payouts of every process (from /proc), and the client references
the rail settled more than once (must be 0). docs/benchmarks.md describes the method.

--baseline river first runs the same work done the way a team would without fencing, on the same
local PostgreSQL and rail stub: each payout created over HTTP with a River job in one transaction,
River workers (--baseline-workers) holding the funds, paying at the rail and posting two ledger
lines. The result line then also has "baseline", "baseline_payouts_per_sec", "baseline_p50_ms",
"baseline_p99_ms", "baseline_cpu_s_per_1000" and "ratio" (payouts' rate divided by the baseline's).

--rounds N runs each system N times, alternating with the baseline (baseline, payouts, payouts,
baseline, ...) so that the machine's drift falls on both alike. The result line then pools the
rounds (payouts and seconds summed, CPU the mean, latencies the median) and "rounds" lists each
run's rate, p99 and CPU in the order they ran.

--role-cpus F holds each payment-resource and rail-proxy process the bench starts (--replicas of
each) to F CPUs with a control group of its own, as a container's CPU limit would: on one machine
every process otherwise shares the same cores, so a replica adds no CPU. The result line then has
"role_cpus" and "throttled_s", how long each limited process was held back by its limit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Logger = a.logger(cmd, "bench")
			if o.Rounds < 1 {
				// 0 would mean the default to the library: on the command
				// line it is a mistake.
				return &ExitError{Code: 2, Err: fmt.Errorf("bench e2e: --rounds must be from 1 to 10")}
			}
			res, err := bench.RunE2E(cmd.Context(), o)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if plot != "" {
				if err := writePlot(plot, res); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
			}
			if out.isJSON() {
				b, _ := json.Marshal(res)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			} else {
				printE2E(cmd.OutOrStdout(), res)
			}
			if res.Duplicates != 0 {
				return &ExitError{Code: 1, Err: fmt.Errorf("%d payouts were paid more than once at the rail", res.Duplicates)}
			}
			if res.BaselineDuplicates != 0 {
				return &ExitError{Code: 1, Err: fmt.Errorf("baseline: %d payouts were paid more than once at the rail", res.BaselineDuplicates)}
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.IntVar(&o.Accounts, "accounts", 100, "accounts to load")
	fl.IntVar(&o.Payouts, "payouts", 1000, "payouts to create (spread round robin over the accounts)")
	fl.IntVar(&o.Executors, "executors", 1, "executor processes")
	fl.IntVar(&o.Concurrency, "concurrency", bench.DefaultE2EConcurrency, "each executor's --concurrency")
	fl.DurationVar(&o.PollInterval, "poll-interval", 100*time.Millisecond, "each executor's --poll-interval")
	fl.DurationVar(&o.RailLatency, "rail-latency", 0, "the rail stub's answer delay (e.g. 10ms, 100ms)")
	fl.DurationVar(&o.RailTimeout, "rail-timeout", stack.DefaultRailTimeout, "every proxy's --rail-timeout (a proxy held to little CPU by --role-cpus needs longer)")
	fl.Float64Var(&o.Rate, "rate", 0, "payouts created per second (0: as fast as the loaders go)")
	fl.IntVar(&o.LoadWorkers, "load-workers", 16, "payouts created at once")
	fl.IntVar(&o.Replicas, "replicas", 1, "payment-resource and rail-proxy processes over the same databases (local stack only); executors are spread over them")
	fl.Float64Var(&o.RoleCPUs, "role-cpus", 0, "limit each payment-resource and rail-proxy process to this many CPUs, as a container's CPU limit (a cgroup quota; local stack only, root on Linux; 0: no limit)")
	fl.StringVar(&o.Baseline, "baseline", "", `also run the baseline, first: "river" (the same work on a River job queue on the same PostgreSQL, no fencing)`)
	fl.IntVar(&o.BaselineWorkers, "baseline-workers", bench.DefaultRiverWorkers, "the baseline's River workers")
	fl.IntVar(&o.Rounds, "rounds", 1, "runs of each system, alternating with the baseline; the result pools them")
	fl.DurationVar(&o.Timeout, "timeout", 30*time.Minute, "give up when the payouts are not all terminal by then")
	fl.StringSliceVar(&o.PaymentURLs, "payment-urls", nil, "use these payment resources instead of starting a stack (comma-separated)")
	fl.StringSliceVar(&o.ProxyURLs, "proxy-urls", nil, "rail proxies of the given system (comma-separated)")
	fl.StringVar(&o.LockURL, "lock-url", "", "lock service of the given system")
	fl.StringVar(&o.RailURL, "rail-url", "", "rail of the given system")
	fl.StringVar(&o.ExecutorToken, "executor-token", "", "executor bearer token of the given system")
	fl.StringVar(&o.OperatorToken, "operator-token", "", "operator bearer token of the given system")
	fl.StringVar(&o.Dir, "dir", "", "directory for the stack and logs (default: a temporary directory, removed afterwards)")
	fl.StringVar(&o.ProfileDir, "profile", "", "write CPU profiles of every process here (5 s slices; go tool pprof merges them)")
	out.register(c, true)
	fl.StringVar(&plot, "plot", "", "write an SVG plot of the run (throughput and latency per second) to this file")
	return c
}

func writePlot(path string, res bench.E2EResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.E2EPlotSVG(f, res); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func printE2E(w io.Writer, r bench.E2EResult) {
	fmt.Fprintf(w, "payouts %d  accounts %d  executors %d x %d  replicas %d  rail latency %d ms  load %s\n",
		r.Payouts, r.Accounts, r.Executors, r.Concurrency, r.Replicas, r.RailLatencyMs, r.LoadAvg)
	fmt.Fprintf(w, "%.1f payouts/s over %.2f s   latency p50 %.1f ms  p99 %.1f ms  max %.1f ms\n",
		r.PayoutsPerSec, r.Seconds, r.P50Ms, r.P99Ms, r.MaxMs)
	fmt.Fprintf(w, "of which waiting to be claimed (created to claimed): p50 %.1f ms  p99 %.1f ms\n", r.ClaimWaitP50Ms, r.ClaimWaitP99Ms)
	fmt.Fprintf(w, "claimed to terminal (the guards and the rail): p50 %.1f ms  p99 %.1f ms\n", r.PathP50Ms, r.PathP99Ms)
	fmt.Fprintf(w, "posted %d  failed %d  ambiguous %d  duplicates at the rail %d\n", r.Posted, r.Failed, r.Ambiguous, r.Duplicates)
	names := make([]string, 0, len(r.CPUPer1000))
	for n := range r.CPUPer1000 {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "CPU seconds per 1,000 payouts:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %7.3f\n", n, r.CPUPer1000[n])
	}
	fmt.Fprintf(w, "  %-12s %7.3f\n", strings.Repeat("-", 5)+" total", bench.SumCPU(r.CPUPer1000))
	if r.RoleCPUs > 0 {
		limited := make([]string, 0, len(r.Throttled))
		for n := range r.Throttled {
			limited = append(limited, n)
		}
		sort.Strings(limited)
		fmt.Fprintf(w, "each payment-resource and proxy process limited to %g CPUs; held back by the limit:", r.RoleCPUs)
		for _, n := range limited {
			fmt.Fprintf(w, "  %s %.1f s", n, r.Throttled[n])
		}
		fmt.Fprintln(w)
	}
	if r.Baseline != "" {
		fmt.Fprintf(w, "baseline %s (%d workers): %.1f payouts/s  latency p50 %.1f ms  p99 %.1f ms  duplicates %d  CPU per 1,000 %.3f s\n",
			r.Baseline, r.BaselineWorkers, r.BaselinePayoutsPerSec, r.BaselineP50Ms, r.BaselineP99Ms, r.BaselineDuplicates, bench.SumCPU(r.BaselineCPUPer1000))
		fmt.Fprintf(w, "ratio (payouts / baseline): %.3f\n", r.Ratio)
	}
	if len(r.Rounds) > 0 {
		fmt.Fprintln(w, "rounds (in the order they ran):")
		for _, rd := range r.Rounds {
			fmt.Fprintf(w, "  %d  %-8s %7.1f payouts/s  p99 %9.1f ms  CPU per 1,000 %.3f s\n", rd.Round, rd.System, rd.PayoutsPerSec, rd.P99Ms, bench.SumCPU(rd.CPUPer1000))
		}
	}
}
