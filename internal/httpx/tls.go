package httpx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// ServerTLS is a server's TLS configuration read from PEM files: its
// certificate chain and key, and, when a client CA file is given, the CA
// whose certificates every client must present (mutual TLS). Reload
// re-reads the files (a server does on SIGHUP): handshakes after it use the
// new certificate, connections already open keep theirs.
type ServerTLS struct {
	certFile, keyFile, clientCAFile string
	current                         atomic.Pointer[tls.Config]
}

// NewServerTLS reads the files once; an error names the file at fault.
func NewServerTLS(certFile, keyFile, clientCAFile string) (*ServerTLS, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: --tls-cert-file and --tls-key-file go together")
	}
	s := &ServerTLS{certFile: certFile, keyFile: keyFile, clientCAFile: clientCAFile}
	return s, s.Reload()
}

// Reload re-reads the certificate, key and client CA; on error the
// configuration in force stays.
func (s *ServerTLS) Reload() error {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return fmt.Errorf("tls: load the server certificate %s and key %s: %w", s.certFile, s.keyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if s.clientCAFile != "" {
		pool, err := certPool(s.clientCAFile)
		if err != nil {
			return err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	s.current.Store(cfg)
	return nil
}

// Config is the configuration for Config.TLS: each handshake uses the
// files as last (re)loaded.
func (s *ServerTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return s.current.Load(), nil },
	}
}

// ClientTLS builds a client's TLS configuration: the CA that signed the
// servers' certificates (empty: the system's roots), and a client
// certificate and key for servers that require one (both or neither).
func ClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := certPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: load the client certificate %s and key %s: %w", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("tls: --cert-file and --key-file go together")
	}
	return cfg, nil
}

func certPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return pool, nil
}

// NewHTTPClient is the one HTTP client every role's client package runs
// on: kept-alive connections, bounded dial, TLS handshake and header waits,
// never an environment proxy (the services talk to each other directly),
// and tlsCfg for https:// URLs (nil: the system's roots). The whole-request
// deadline is each call's context (Client's WithTimeout), so a waiting
// lock acquire is not cut short by a client-wide timeout.
func NewHTTPClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Transport: newTransport(tlsCfg), CheckRedirect: noRedirects}
}

// noRedirects answers a redirect with the redirect itself: the roles never
// redirect, so one comes from something in between, and following it would
// send a POST again elsewhere, or turn it into a GET whose answer reads as
// the POST's. Decoded as an error of no known kind, its outcome is unknown.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// readHeaderTimeout is how long a server waits for a request's header,
// a new connection's first request included; clientIdleTimeout is how
// long a client keeps a connection it is not using, well below it.
const (
	readHeaderTimeout = 10 * time.Second
	clientIdleTimeout = readHeaderTimeout / 2
)

func newTransport(tlsCfg *tls.Config) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 10 * time.Second,
		// HTTP/1.1 only, TLS or not. Go's HTTP/2 client sends a request
		// again, body and all, when the server resets its stream with a
		// protocol error, which a server may do after acting on it: a
		// payment at the rail made twice. HTTP/1.1 sends a POST again only
		// when not a byte of it was written.
		ForceAttemptHTTP2: false,
		// A worker pool of up to 256 callers (executor --concurrency)
		// keeps its connections: fewer idle slots than callers means
		// closing and re-dialling connections under load.
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 256,
		// Below the servers' header timeout: a connection dialled for a
		// request that then went out on one freed meanwhile waits in the
		// pool unused, and a server closes a connection with no request
		// readHeaderTimeout after accepting it. Were the pool to keep it
		// as long, a request taking it just then (a lock session's
		// keepalive every 10 s did, right on time) would be answered with
		// a reset, and not retried: a POST on a connection never used.
		// The client closes it first.
		IdleConnTimeout:       clientIdleTimeout,
		ExpectContinueTimeout: time.Second,
	}
}
