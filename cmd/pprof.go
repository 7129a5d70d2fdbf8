package cmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/httpx"
)

// pprofFlag is --pprof-listen: Go's profiler on a listener of its own,
// off unless asked for, and only ever on loopback (profiles show memory
// contents, tokens included).
type pprofFlag struct{ addr string }

func (p *pprofFlag) register(c *cobra.Command) {
	c.Flags().StringVar(&p.addr, "pprof-listen", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060); empty: off")
}

func (p *pprofFlag) check() error {
	if p.addr != "" && !isLoopback(p.addr) {
		return fmt.Errorf("--pprof-listen %s: the profiler may only listen on a loopback address", p.addr)
	}
	return nil
}

// isLoopback reports whether a listen address binds loopback only. An
// empty host (":7102") binds every interface.
func isLoopback(addr string) bool { return isLoopbackVia(addr, net.LookupHost) }

// isLoopbackVia is isLoopback with the resolver lookup. "localhost" is
// whatever the resolver says it is (/etc/hosts, then DNS): it binds
// loopback only when every address it resolves to is a loopback one.
func isLoopbackVia(addr string, lookup func(host string) ([]string, error)) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	if host != "localhost" {
		return false
	}
	addrs, err := lookup(host)
	if err != nil || len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// runWithPprof runs role, and the profiler beside it when addr is set;
// either one ending ends both.
func runWithPprof(ctx context.Context, addr string, log *slog.Logger, role func(context.Context) error) error {
	if addr == "" {
		return role(ctx)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("pprof listening", "addr", ln.Addr().String())
	var g httpx.Group
	g.Add(role)
	g.Add(func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return fmt.Errorf("pprof: %w", err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	return g.Run(ctx)
}
