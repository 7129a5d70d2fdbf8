package cmd

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy"
)

func init() {
	register(func(root, serve, run, dev *cobra.Command) { serve.AddCommand(newServeProxyCmd()) })
}

func newServeProxyCmd() *cobra.Command {
	var (
		sf          serverFlags
		railURL     string
		railToken   string
		railTimeout time.Duration
	)
	c := &cobra.Command{
		Use:   "proxy",
		Short: "Run the rail proxy: guard 2, one submission per payout ever, intent written before the rail is called",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := sf.setup(cmd, "proxy", migrations.ProxyDB)
			if err != nil {
				return err
			}
			if railTimeout <= 0 {
				return &ExitError{Code: 2, Err: errors.New("--rail-timeout must be positive")}
			}
			return railproxy.Run(cmd.Context(), railproxy.Config{
				Addr: sf.listen, Logger: env.Logger, Registry: env.Registry, Auth: env.Auth,
				DatabaseURL: sf.databaseURL, RailURL: railURL, RailToken: railToken, RailTimeout: railTimeout,
			})
		},
	}
	sf.register(c, ":7103", true)
	fl := c.Flags()
	fl.StringVar(&railURL, "rail-url", "http://127.0.0.1:7104", "URL of the rail")
	fl.StringVar(&railToken, "rail-token", "", "bearer token sent to the rail")
	fl.DurationVar(&railTimeout, "rail-timeout", 10*time.Second, "how long to wait for the rail's answer before recording TIMEOUT (never retried)")
	return c
}
