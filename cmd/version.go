package cmd

import (
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/obs"
)

func newVersionCmd(a *app) *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the version, the revision it was built from and the Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			b := obs.Build()
			return out.print(cmd.OutOrStdout(), b, newTable("VERSION", "REVISION", "GO").row(b.Version, b.Revision, b.Go))
		},
	}
	out.register(c, false)
	return c
}
