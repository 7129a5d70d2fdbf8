package cmd

import (
	"fmt"

	"github.com/spf13/cobra"
)

// service names a role a client command calls; each gets its URL flag.
type service int

const (
	lockService service = iota
	paymentService
	proxyService
	railService
)

// clientFlags are the flags of a command that calls other roles (DESIGN
// §4b): the URL of each role it calls, and its credential.
type clientFlags struct {
	role       string // the caller role whose token is expected (for messages)
	lockURL    string
	paymentURL string
	proxyURL   string
	railURL    string
	token      string
	tokenFile  string
}

// register adds the URL flags of the services c calls and the credential flags.
func (f *clientFlags) register(c *cobra.Command, role string, calls ...service) {
	f.role = role
	fl := c.Flags()
	for _, s := range calls {
		switch s {
		case lockService:
			fl.StringVar(&f.lockURL, "lock-url", "http://127.0.0.1:7101", "lock service URL")
		case paymentService:
			fl.StringVar(&f.paymentURL, "payment-url", "http://127.0.0.1:7102", "payment resource URL")
		case proxyService:
			fl.StringVar(&f.proxyURL, "proxy-url", "http://127.0.0.1:7103", "rail proxy URL")
		case railService:
			fl.StringVar(&f.railURL, "rail-url", "http://127.0.0.1:7104", "rail URL")
		}
	}
	fl.StringVar(&f.token, "token", "", "bearer token of the "+role+" role (visible in ps: prefer --token-file or "+EnvName("token")+")")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token of the "+role+" role")
}

// bearer is the caller's token; it is required.
func (f *clientFlags) bearer() (string, error) {
	tok, err := secret("token", f.token, f.tokenFile)
	if err == nil && tok == "" {
		err = fmt.Errorf("--token-file or --token (or %s) is required: the %s's bearer token", EnvName("token-file"), f.role)
	}
	if err != nil {
		return "", &ExitError{Code: 2, Err: err}
	}
	return tok, nil
}
