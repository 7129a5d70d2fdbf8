package cmd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy"
)

func newServeProxyCmd(a *app) *cobra.Command {
	var (
		sf            serverFlags
		railURL       string
		railToken     string
		railTokenFile string
		railTimeout   time.Duration
		railTLS       clientTLS
	)
	c := &cobra.Command{
		Use:   "proxy",
		Short: "Run the rail proxy: guard 2, one submission per payout ever, intent written before the rail is called",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if railTimeout <= 0 {
				return &ExitError{Code: 2, Err: errors.New("--rail-timeout must be positive")}
			}
			if err := checkURL("rail-url", railURL); err != nil {
				return err
			}
			hc, err := railTLS.httpClient()
			if err != nil {
				return err
			}
			// The rail credential is required: without it the rail answers
			// every payment 401 and each payout forwarded becomes
			// RAIL_AMBIGUOUS. A rail started with --insecure-no-auth takes
			// any value. Checked after the common flags (a server without
			// --auth-file is told that first), before the database.
			var tok string
			env, err := sf.setup(cmd, a, func() error {
				var err error
				tok, err = bearerSecret("rail-token", railToken, railTokenFile)
				if err == nil && tok == "" {
					err = fmt.Errorf("--rail-token-file or --rail-token (or %s or %s) is required: the proxy's own proxy-role token at the rail, which refuses payments without it", EnvName("rail-token-file"), EnvName("rail-token"))
				}
				if err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				return nil
			})
			if err != nil {
				return err
			}
			cfg := railproxy.Config{
				Addr: sf.listen, Logger: env.Logger, Registry: env.Registry, Auth: env.Auth, TLS: env.TLS,
				DatabaseURL: env.DatabaseURL, RailURL: railURL, RailToken: tok, RailTimeout: railTimeout, HTTPClient: hc,
			}
			return env.run(cmd.Context(), func(ctx context.Context) error { return railproxy.Run(ctx, cfg) })
		},
	}
	sf.register(c, "proxy", "127.0.0.1:7103", migrations.ProxyDB)
	fl := c.Flags()
	fl.StringVar(&railURL, "rail-url", "http://127.0.0.1:7104", "URL of the rail")
	fl.StringVar(&railToken, "rail-token", "", "the proxy's own bearer token (role proxy) at the rail; required unless --rail-token-file is given (visible in ps: prefer --rail-token-file)")
	fl.StringVar(&railTokenFile, "rail-token-file", "", "file holding the proxy's own bearer token (role proxy) at the rail (required unless --rail-token is given)")
	railTLS.register(c)
	fl.DurationVar(&railTimeout, "rail-timeout", 10*time.Second, "how long to wait for the rail's answer before recording TIMEOUT (never retried)")
	return c
}
