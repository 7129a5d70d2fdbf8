package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/dev/bench"
)

func newBenchLockCmd() *cobra.Command {
	var (
		o         bench.LockOptions
		endpoints string
		out       output
		profile   string
	)
	c := &cobra.Command{
		Use:   "lock --backend etcd|postgres --clients N --duration D [--json]",
		Short: "Measure the lock service (acquire+release pairs over HTTP) against its store used directly, in alternating rounds",
		Long: "Starts what it needs (an embedded etcd, or a throwaway PostgreSQL cluster with fsync on) unless\n" +
			"--etcd-endpoints or --database-url names one, runs the lock service in this process on loopback, and\n" +
			"alternates rounds of the service and of the baseline (etcd: concurrency.Mutex on the same etcd;\n" +
			"PostgreSQL: the same conditional insert and delete, directly). Each client holds its own session\n" +
			"and key. Prints pairs/s, acquire latency (p50, p99, max), lock-service heap per live session and\n" +
			"the ratio to the baseline; --json prints one line.",
		Args: cobra.NoArgs,
		// The lock service runs in this process, so it runs as `serve
		// lock` does: with the roles' garbage collector target.
		PersistentPreRunE: roleHook,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, e := range strings.Split(endpoints, ",") {
				if e = strings.TrimSpace(e); e != "" {
					o.EtcdEndpoints = append(o.EtcdEndpoints, e)
				}
			}
			if err := checkLockBackend(o.Backend); err != nil {
				return err
			}
			if o.Clients < 1 || o.Duration <= 0 || o.Rounds < 1 || o.Sessions < 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--clients, --duration and --rounds must be positive, --sessions not negative")}
			}
			if !out.isJSON() {
				o.Progress = cmd.ErrOrStderr()
			}
			if profile != "" {
				f, err := os.Create(profile)
				if err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			res, err := bench.Lock(cmd.Context(), o)
			if err != nil {
				return err
			}
			if out.isJSON() {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			return writeLockBench(cmd.OutOrStdout(), res)
		},
	}
	f := c.Flags()
	f.StringVar(&o.Backend, "backend", "", "lock store: etcd or postgres (required)")
	f.IntVar(&o.Clients, "clients", 32, "concurrent clients, each with its own session and key")
	f.DurationVar(&o.Duration, "duration", 30*time.Second, "measured time per system, split over --rounds alternating rounds")
	f.IntVar(&o.Rounds, "rounds", 3, "alternating rounds per system")
	f.IntVar(&o.Sessions, "sessions", 10000, "live sessions opened to measure memory per session (0: skip)")
	f.StringVar(&endpoints, "etcd-endpoints", "", "use this etcd (comma-separated client URLs) instead of an embedded one")
	f.StringVar(&o.DatabaseURL, "database-url", "", "use this migrated lockdb instead of a throwaway cluster")
	f.StringVar(&o.Dir, "dir", "", "scratch directory for the throwaway store (default: a temporary directory)")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the whole run (service, store client and baseline) to FILE")
	out.register(c, true)
	return c
}

func writeLockBench(w io.Writer, r bench.LockResult) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "backend %s, %d clients, %.0fs per system\n\n", r.Backend, r.Clients, r.DurationS)
	fmt.Fprintln(tw, "SYSTEM\tPAIRS/S\tP50 MS\tP99 MS\tMAX MS")
	fmt.Fprintf(tw, "lock service\t%.1f\t%.3f\t%.3f\t%.3f\n", r.OpsPerSec, r.P50Ms, r.P99Ms, r.MaxMs)
	fmt.Fprintf(tw, "%s\t%.1f\t%.3f\t%.3f\t%.3f\n", r.Baseline, r.BaselineOpsPerSec, r.BaselineP50Ms, r.BaselineP99Ms, r.BaselineMaxMs)
	fmt.Fprintf(tw, "\nratio\t%.3f\n", r.Ratio)
	if r.BytesPerSession != 0 {
		fmt.Fprintf(tw, "memory per live session\t%.0f B\n", r.BytesPerSession)
	}
	fmt.Fprintln(tw, "\nROUND\tSYSTEM\tPAIRS/S\tP99 MS")
	for i, rd := range r.Rounds {
		fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.3f\n", i/2+1, rd.System, rd.OpsPerSec, rd.P99Ms)
	}
	return tw.Flush()
}
