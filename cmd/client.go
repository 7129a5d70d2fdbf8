package cmd

import (
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/httpx"
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
// §4b): the URL of each role it calls, its credential and its TLS settings.
type clientFlags struct {
	role       string // the caller role whose token is expected (for messages)
	lockURL    string
	paymentURL string
	proxyURL   string
	railURL    string
	token      string
	tokenFile  string
	tls        clientTLS
}

// register adds the URL flags of the services c calls, the credential and
// the TLS flags.
func (f *clientFlags) register(c *cobra.Command, role string, calls ...service) {
	f.role = role
	fl := c.Flags()
	for _, s := range calls {
		switch s {
		case lockService:
			fl.StringVar(&f.lockURL, "lock-url", "http://127.0.0.1:7101", "lock service URL (https:// with TLS)")
		case paymentService:
			fl.StringVar(&f.paymentURL, "payment-url", "http://127.0.0.1:7102", "payment resource URL (https:// with TLS)")
		case proxyService:
			fl.StringVar(&f.proxyURL, "proxy-url", "http://127.0.0.1:7103", "rail proxy URL (https:// with TLS)")
		case railService:
			fl.StringVar(&f.railURL, "rail-url", "http://127.0.0.1:7104", "rail URL (https:// with TLS)")
		}
	}
	fl.StringVar(&f.token, "token", "", "bearer token of the "+role+" role (visible in ps: prefer --token-file or "+EnvName("token")+")")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token of the "+role+" role")
	f.tls.register(c)
}

// checkURL refuses, as a usage error naming the flag, a --NAME URL no
// client of the roles can call: the clients' own check (httpx.NewClient:
// http(s)://host:port), made before anything is started or connected, so
// a command that calls the role later does not fail as if it were down.
func checkURL(flag, u string) error {
	if _, err := httpx.NewClient(u, ""); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("--%s: %w", flag, err)}
	}
	return nil
}

// bearer is the caller's token; it is required.
func (f *clientFlags) bearer() (string, error) {
	tok, err := bearerSecret("token", f.token, f.tokenFile)
	if err == nil && tok == "" {
		err = fmt.Errorf("--token-file or --token (or %s or %s) is required: the %s's bearer token", EnvName("token-file"), EnvName("token"), f.role)
	}
	if err != nil {
		return "", &ExitError{Code: 2, Err: err}
	}
	return tok, nil
}

// clientTLS is --ca-file, --cert-file and --key-file of a role that calls
// another.
type clientTLS struct {
	caFile, certFile, keyFile string
}

func (t *clientTLS) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&t.caFile, "ca-file", "", "PEM CA that signed the services' certificates, for https:// URLs (default: the system's roots)")
	fl.StringVar(&t.certFile, "cert-file", "", "PEM client certificate for services that require one (mutual TLS); needs --key-file")
	fl.StringVar(&t.keyFile, "key-file", "", "PEM private key of --cert-file")
}

// httpClient is the one HTTP client of the process's calls to other roles.
func (t *clientTLS) httpClient() (*http.Client, error) {
	cfg, err := httpx.ClientTLS(t.caFile, t.certFile, t.keyFile)
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	return httpx.NewHTTPClient(cfg), nil
}

// connect is the caller's token and HTTP client.
func (f *clientFlags) connect() (string, *http.Client, error) {
	token, err := f.bearer()
	if err != nil {
		return "", nil, err
	}
	hc, err := f.tls.httpClient()
	return token, hc, err
}
