package cmd

import "github.com/spf13/cobra"

// newBenchCmd is `payouts bench`: each benchmark runs its baseline in the
// same run. Every benchmark command is listed here.
func newBenchCmd(a *app) *cobra.Command {
	b := &cobra.Command{Use: "bench", Short: "Benchmarks with their baselines in one run"}
	b.AddCommand(
		newBenchE2ECmd(a),
		newBenchReconcileCmd(a),
		newBenchLockCmd(),
	)
	return b
}
