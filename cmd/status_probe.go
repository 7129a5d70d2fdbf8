package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// prober asks the roles for `payouts status`.
type prober struct {
	ctx        context.Context
	hc         *http.Client
	token      string
	timeout    time.Duration
	countLimit int
	healthOnly bool  // health, readiness and version only: no token, no key numbers
	refused    error // the first call a role refused the token for (401/403): exit 2
}

// target is one role status asks, at its URL.
type target struct{ role, url string }

func (p *prober) probeAll(targets []target) statusReport {
	rep := statusReport{Problems: []string{}, Roles: make([]roleStatus, len(targets))}
	for i, tg := range targets {
		rep.Roles[i] = p.base(tg.role, tg.url)
	}
	// The guards' fences first and the lock service's high token last, as
	// the reconciler reads them: a token granted while status runs is then
	// above every fence read before it, never taken for a rewind.
	var lockHigh *int64
	if !p.healthOnly {
		for i, tg := range targets {
			switch tg.role {
			case "payment":
				p.payment(&rep.Roles[i])
			case "proxy":
				p.proxy(&rep.Roles[i])
			}
		}
		for i, tg := range targets {
			if tg.role == "lock" {
				p.lock(&rep.Roles[i])
				lockHigh = rep.Roles[i].HighToken
			}
		}
	}
	for _, r := range rep.Roles {
		if !r.Healthy {
			rep.Problems = append(rep.Problems, r.Role+" is down ("+r.URL+"): "+strings.Join(r.Errors, "; "))
			continue
		}
		if !r.Ready {
			rep.Problems = append(rep.Problems, r.Role+" is not ready ("+r.URL+")")
		}
		for _, e := range r.Errors {
			rep.Problems = append(rep.Problems, r.Role+": "+e)
		}
		if r.HighFence != nil && lockHigh != nil && *r.HighFence > *lockHigh {
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s's high fence %d exceeds the lock service's high token %d: the lock service's tokens went back (restore without D-13?) and it re-issues tokens already issued: accounts whose fence is above them stall, the others accept them; stop every lock service, then on the PostgreSQL backend `payouts lock bump-tokens --from-guards --database-url-file FILE` (or --to above %d by a margin), on etcd a restore with `etcdutl snapshot restore --bump-revision` (docs/operations.md, lock_service_rewound)",
				r.Role, *r.HighFence, *lockHigh, *r.HighFence))
		}
	}
	rep.OK = len(rep.Problems) == 0
	return rep
}

// base reads health, readiness and version; the role's key numbers are
// only asked for when it is healthy.
func (p *prober) base(role, url string) roleStatus {
	r := roleStatus{Role: role, URL: strings.TrimRight(url, "/")}
	status, _, err := p.get(r.URL + "/healthz")
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return r
	}
	r.Healthy = status == http.StatusOK
	if !r.Healthy {
		r.Errors = append(r.Errors, fmt.Sprintf("/healthz answered %d", status))
	}
	status, _, err = p.get(r.URL + "/readyz")
	r.Ready = err == nil && status == http.StatusOK
	if status, body, err := p.get(r.URL + "/version"); err == nil && status == http.StatusOK {
		var b obs.BuildInfo
		if json.Unmarshal(body, &b) == nil {
			r.Version = &b
		}
	}
	return r
}

func (p *prober) get(url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, body, err
}

// metric sums the samples of a counter or gauge on the role's /metrics.
func (p *prober) metric(r *roleStatus, name string) *float64 {
	return p.metrics(r, name)[0]
}

// metrics is metric for several series, read from one scrape of /metrics:
// one sum per name, in order (all nil when /metrics cannot be read).
func (p *prober) metrics(r *roleStatus, names ...string) []*float64 {
	out := make([]*float64, len(names))
	status, body, err := p.get(r.URL + "/metrics")
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("HTTP %d", status)
	}
	var mfs map[string]*dto.MetricFamily
	if err == nil {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err = parser.TextToMetricFamilies(strings.NewReader(string(body)))
	}
	if err != nil {
		r.Errors = append(r.Errors, "read /metrics: "+err.Error())
		return out
	}
	for i, name := range names {
		var sum float64
		for _, m := range mfs[name].GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		out[i] = &sum
	}
	return out
}

// call runs one API read with the call timeout, noting a failure.
func (p *prober) call(r *roleStatus, what string, fn func(ctx context.Context) error) bool {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		r.Errors = append(r.Errors, what+": "+err.Error())
		if p.refused == nil && (problem.Has(err, problem.Unauthorized) || problem.Has(err, problem.Forbidden)) {
			p.refused = fmt.Errorf("the %s at %s refused the token (%s): %w", r.Role, r.URL, what, err)
		}
		return false
	}
	return true
}

func tokenPtr(t fencing.Token) *int64 { v := int64(t); return &v }

func (p *prober) lock(r *roleStatus) {
	if !r.Healthy {
		return
	}
	c, err := lockclient.New(r.URL, lockclient.WithToken(p.token), lockclient.WithHTTPClient(p.hc), lockclient.WithRequestTimeout(p.timeout))
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return
	}
	r.Sessions = p.metric(r, "payouts_lock_active_sessions")
	p.call(r, "held locks", func(ctx context.Context) error {
		locks, err := c.Locks(ctx, "")
		if err != nil {
			return err
		}
		held := 0
		for _, l := range locks {
			if l.Held {
				held++
			}
		}
		r.HeldLocks = &held
		return nil
	})
	p.call(r, "high token", func(ctx context.Context) error {
		t, err := c.HighToken(ctx)
		if err == nil {
			r.HighToken = tokenPtr(t)
		}
		return err
	})
}

func (p *prober) payment(r *roleStatus) {
	if !r.Healthy {
		return
	}
	c, err := pc.New(r.URL, p.token, httpx.WithHTTPClient(p.hc), httpx.WithTimeout(p.timeout))
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return
	}
	r.PayoutsByState = map[string]int64{}
	for _, s := range pc.States {
		f := pc.PayoutFilter{State: s, Limit: min(1000, p.countLimit)}
		p.call(r, "count "+string(s)+" payouts", func(ctx context.Context) error {
			for {
				page, err := c.Payouts(ctx, f)
				if err != nil {
					delete(r.PayoutsByState, string(s)) // unknown, not zero
					return err
				}
				r.PayoutsByState[string(s)] += int64(len(page.Items))
				if page.Next == "" || len(page.Items) == 0 {
					return nil
				}
				if r.PayoutsByState[string(s)] >= int64(p.countLimit) {
					r.PayoutsCapped = append(r.PayoutsCapped, string(s))
					return nil
				}
				f.After = page.Next
			}
		})
	}
	if amb, ok := r.PayoutsByState[string(pc.RailAmbiguous)]; ok {
		r.Ambiguous = &amb
	}
	r.FencedOut = p.metric(r, "payouts_payment_fenced_out_total")
	p.call(r, "high fence", func(ctx context.Context) error {
		t, err := c.HighFence(ctx)
		if err == nil {
			r.HighFence = tokenPtr(t)
		}
		return err
	})
}

func (p *prober) proxy(r *roleStatus) {
	if !r.Healthy {
		return
	}
	c, err := proxyclient.New(r.URL, p.token, httpx.WithHTTPClient(p.hc), httpx.WithTimeout(p.timeout))
	if err != nil {
		r.Errors = append(r.Errors, err.Error())
		return
	}
	m := p.metrics(r, "payouts_proxy_fenced_out_total", "payouts_proxy_rail_paused")
	r.FencedOut, r.RailPaused = m[0], m[1]
	p.call(r, "high fence", func(ctx context.Context) error {
		t, err := c.HighFence(ctx)
		if err == nil {
			r.HighFence = tokenPtr(t)
		}
		return err
	})
}
