package cmd

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/obs"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// roleStatus is what `payouts status` learnt of one role. Key numbers are
// absent (null) when the role does not have them or could not be asked.
type roleStatus struct {
	Role    string         `json:"role"`
	URL     string         `json:"url"`
	Healthy bool           `json:"healthy"`
	Ready   bool           `json:"ready"`
	Version *obs.BuildInfo `json:"version"`
	Errors  []string       `json:"errors,omitempty"`
	// Lock service.
	Sessions  *float64 `json:"sessions,omitempty"`
	HeldLocks *int     `json:"held_locks,omitempty"`
	HighToken *int64   `json:"high_token,omitempty"`
	// Payment resource and rail proxy.
	PayoutsByState map[string]int64 `json:"payouts_by_state,omitempty"`
	// PayoutsCapped lists the states with more payouts than status counts
	// (--count-limit): their numbers are lower bounds.
	PayoutsCapped []string `json:"payouts_capped,omitempty"`
	Ambiguous     *int64   `json:"ambiguous,omitempty"`
	FencedOut     *float64 `json:"fenced_out,omitempty"` // since the process started (its counter)
	HighFence     *int64   `json:"high_fence,omitempty"`
	// Rail proxy: 1 while it forwards no new submissions because the rail
	// gives no usable answer (docs/api.md, "The rail pause").
	RailPaused *float64 `json:"rail_paused,omitempty"`
}

// statusReport is the whole answer; OK is false when any role is down or
// unready, a number could not be read, or a guard's high fence exceeds the
// lock service's high token (D-13: restore lockdb with bump-tokens).
type statusReport struct {
	OK       bool         `json:"ok"`
	Problems []string     `json:"problems"`
	Roles    []roleStatus `json:"roles"`
}

func newStatusCmd(a *app) *cobra.Command {
	var (
		cf         clientFlags
		out        output
		timeout    time.Duration
		countLimit int
		only       string
		healthOnly bool
		extra      statusExtraURLs
	)
	c := &cobra.Command{
		Use:   "status",
		Short: "Every role's health, readiness, version and key numbers (exit 1 when a role is down or a guard's fence is above the lock service's high token)",
		Long: `status asks each role whose URL is given (the defaults are the loopback ports; pass an empty
URL to leave a role out) for GET /healthz, /readyz and /version, and for its key numbers:
lock service: live sessions, held locks, highest token issued; payment resource: payouts by
state, ambiguous payouts, fenced_out since start, highest fence; rail proxy: fenced_out since
start, highest fence, rail_paused (1 while it forwards nothing because the rail gives no usable
answer); rail: up. Numbers the API has no endpoint for are read from /metrics.
The executor (--metrics-listen) and the reconciler (--listen) are asked only when their URL is
given. --only ROLE asks that role alone; --health-only asks only for health, readiness and
version, needs no token and reads no numbers (a container healthcheck:
payouts status --only payment --health-only --payment-url https://127.0.0.1:7102 --ca-file ca.pem).

Exit 0: every role is healthy and ready and no guard's fence exceeds the lock service's high
token. Exit 1: otherwise (the problems are listed). Exit 2: bad flags or a refused token.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 || countLimit < 1 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--timeout and --count-limit must be positive")}
			}
			targets, err := statusTargets(&cf, extra, only)
			if err != nil {
				return err
			}
			var token string
			var hc *http.Client
			if healthOnly {
				hc, err = cf.tls.httpClient()
			} else {
				token, hc, err = cf.connect()
			}
			if err != nil {
				return err
			}
			p := &prober{hc: hc, token: token, timeout: timeout, countLimit: countLimit, healthOnly: healthOnly, ctx: cmd.Context()}
			rep := p.probeAll(targets)
			if err := out.print(cmd.OutOrStdout(), rep, statusTable(rep)); err != nil {
				return err
			}
			if !rep.OK {
				if !out.isJSON() {
					for _, pr := range rep.Problems {
						fmt.Fprintln(cmd.ErrOrStderr(), "problem:", pr)
					}
				}
				if p.refused != nil {
					return &ExitError{Code: 2, Err: p.refused} // asking again cannot help
				}
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cf.register(c, "operator", lockService, paymentService, proxyService, railService)
	out.register(c, false)
	c.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "timeout of each call to a role")
	c.Flags().IntVar(&countLimit, "count-limit", 10000, "count at most this many payouts per state")
	c.Flags().StringVar(&extra.executor, "executor-url", "", "an executor's --metrics-listen URL (empty: not asked)")
	c.Flags().StringVar(&extra.reconciler, "reconciler-url", "", "the reconciler's --listen URL (empty: not asked)")
	c.Flags().StringVar(&only, "only", "", "ask only this role: "+strings.Join(statusRoles, ", "))
	c.Flags().BoolVar(&healthOnly, "health-only", false, "ask only for health, readiness and version (no token needed, no key numbers)")
	return c
}

// statusRoles are the roles status can ask, in the order it asks them.
var statusRoles = []string{"lock", "payment", "proxy", "rail", "executor", "reconciler"}

// statusExtraURLs are the roles only status asks (no other client calls
// them): their URL flags are status's own.
type statusExtraURLs struct{ executor, reconciler string }

// statusTargets are the roles to ask: those with a URL, or only the one
// --only names (which must then have a URL). Every error is a usage error
// (exit 2): a malformed URL too, as every other client refuses it, not a
// role reported down.
func statusTargets(cf *clientFlags, extra statusExtraURLs, only string) ([]target, error) {
	usage := func(err error) error { return &ExitError{Code: 2, Err: err} }
	urls := []string{cf.lockURL, cf.paymentURL, cf.proxyURL, cf.railURL, extra.executor, extra.reconciler}
	if only != "" && !slices.Contains(statusRoles, only) {
		return nil, usage(fmt.Errorf("--only %q: want one of %s", only, strings.Join(statusRoles, ", ")))
	}
	for i, role := range statusRoles {
		if urls[i] != "" {
			if err := checkURL(role+"-url", urls[i]); err != nil {
				return nil, err
			}
		}
	}
	var out []target
	for i, role := range statusRoles {
		if only != "" && role != only {
			continue
		}
		if urls[i] == "" {
			if only != "" {
				return nil, usage(fmt.Errorf("--only %s needs --%s-url", role, role))
			}
			continue
		}
		out = append(out, target{role: role, url: urls[i]})
	}
	if len(out) == 0 {
		return nil, usage(errors.New("no role to ask: every URL is empty"))
	}
	return out, nil
}

func statusTable(rep statusReport) *table {
	t := newTable("ROLE", "URL", "HEALTHY", "READY", "VERSION", "KEY NUMBERS")
	for _, r := range rep.Roles {
		version := "-"
		if r.Version != nil {
			version = r.Version.Version + " (" + shortRevision(r.Version.Revision) + ")"
		}
		t.row(r.Role, r.URL, yesNo(r.Healthy), yesNo(r.Ready), version, dash(keyNumbers(r)))
	}
	return t
}

func keyNumbers(r roleStatus) string {
	var parts []string
	add := func(name, v string) { parts = append(parts, name+"="+v) }
	if r.Sessions != nil {
		add("sessions", strconv.FormatFloat(*r.Sessions, 'f', -1, 64))
	}
	if r.HeldLocks != nil {
		add("held_locks", strconv.Itoa(*r.HeldLocks))
	}
	if r.HighToken != nil {
		add("high_token", strconv.FormatInt(*r.HighToken, 10))
	}
	for _, s := range pc.States {
		if n := r.PayoutsByState[string(s)]; n > 0 {
			v := strconv.FormatInt(n, 10)
			if slices.Contains(r.PayoutsCapped, string(s)) {
				v += "+"
			}
			add(string(s), v)
		}
	}
	if r.Ambiguous != nil {
		add("ambiguous", strconv.FormatInt(*r.Ambiguous, 10))
	}
	if r.FencedOut != nil {
		add("fenced_out", strconv.FormatFloat(*r.FencedOut, 'f', -1, 64))
	}
	if r.HighFence != nil {
		add("high_fence", strconv.FormatInt(*r.HighFence, 10))
	}
	if r.RailPaused != nil {
		add("rail_paused", strconv.FormatFloat(*r.RailPaused, 'f', -1, 64))
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func shortRevision(r string) string {
	if len(r) > 12 {
		return r[:12]
	}
	return r
}
