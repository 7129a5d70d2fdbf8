package cmd

import "github.com/spf13/cobra"

// benchRegistrations let each benchmark's file add its command under
// `payouts bench` (see onBench in bench_*.go).
var benchRegistrations []func(bench *cobra.Command)

func onBench(fn func(bench *cobra.Command)) { benchRegistrations = append(benchRegistrations, fn) }

func init() {
	register(func(root, serve, run, dev *cobra.Command) {
		b := &cobra.Command{Use: "bench", Short: "Benchmarks with their baselines in one run"}
		for _, fn := range benchRegistrations {
			fn(b)
		}
		root.AddCommand(b)
	})
}
