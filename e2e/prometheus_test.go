package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// counters every deployment must see once a payout has been paid: the
// safety counters the alerts page on (present at 0 from the start), and
// the work counters the dashboard draws.
var wantSeries = []string{
	"payouts_lock_grants_total", "payouts_lock_expirations_total", "payouts_lock_expired_sessions_total", "payouts_lock_revocations_total",
	"payouts_payment_fenced_out_total", "payouts_payment_token_regressions_total", "payouts_payment_transitions_total",
	"payouts_payment_ledger_drift_accounts", "payouts_payment_ledger_unbalanced_groups",
	"payouts_payment_payouts", "payouts_payment_oldest_open_age_seconds", "payouts_payment_oldest_ambiguous_age_seconds", "payouts_payment_resolution_sla_seconds",
	"payouts_proxy_fenced_out_total", "payouts_proxy_duplicate_attempts_total", "payouts_proxy_submissions_total",
	"payouts_payment_guard_disabled", "payouts_proxy_guard_disabled", "payouts_rail_payments_total",
	"payouts_executor_payouts_total", "payouts_executor_step_duration_seconds_bucket",
	"payouts_reconcile_findings", "payouts_reconcile_last_success_timestamp_seconds",
	"payouts_http_requests_total", "payouts_build_info",
}

// TestPrometheusScrapesEveryRole runs Debian's Prometheus server against a
// local stack plus an executor and a continuous reconciler, with the alert
// rules loaded, and checks through its HTTP API that every role is up,
// that the project's counters arrive and that every rule group evaluates.
func TestPrometheusScrapesEveryRole(t *testing.T) {
	prometheus := requireTool(t, "prometheus")
	s := startSystem(t, stack.Options{})
	r := s.st.Ready

	free := func() string {
		p, err := infra.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return "127.0.0.1:" + strconv.Itoa(p)
	}
	execAddr, recAddr := free(), free()
	ex := s.startExecutor(t, "prom-executor", nil, "--metrics-listen", execAddr)
	rec := proctest.Start(t, "prom-reconcile", []string{"PAYOUTS_TOKEN=" + r.Tokens.Reconciler},
		"reconcile", "--interval", "2s", "--listen", recAddr, "--lock-url", r.LockURL, "--payment-url", r.PaymentURL,
		"--proxy-url", r.ProxyURL, "--rail-url", r.RailURL, "--rail-token-file", r.TokenFiles["reconciler"])
	for _, w := range []struct {
		addr string
		p    *proctest.Proc
	}{{execAddr, ex}, {recAddr, rec}} {
		waitUntil(t, 5*time.Minute, w.p.Name+" /metrics", func() (bool, error) {
			resp, err := http.Get("http://" + w.addr + "/metrics")
			if err != nil {
				if w.p.Exited() {
					t.Fatalf("%s exited:\n%s", w.p.Name, tailLines(w.p.Log(), 30))
				}
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
	}

	s.createAccount(t, "prom-acc", 100_000)
	s.createPayout(t, "prom-po-1", "prom-acc", 1234, "NL00PROM1")
	s.waitPayoutState(t, "prom-po-1", 5*time.Minute, pc.Posted)

	targets := map[string]string{
		"lock": hostPort(t, r.LockURL), "payment": hostPort(t, r.PaymentURL), "proxy": hostPort(t, r.ProxyURL),
		"rail": hostPort(t, r.RailURL), "executor": execAddr, "reconcile": recAddr,
	}
	api := startPrometheus(t, prometheus, targets, r.Tokens.Operator)

	// Every role is up.
	waitUntil(t, 5*time.Minute, "every payouts job up", func() (bool, error) {
		res, err := promQuery(api, `up{job=~"payouts-.*"}`)
		if err != nil {
			return false, err
		}
		up := map[string]bool{}
		for _, s := range res {
			up[strings.TrimPrefix(s.Metric["job"], "payouts-")] = s.Value == "1"
		}
		for role := range targets {
			if !up[role] {
				return false, fmt.Errorf("not up: %s (seen %v)", role, up)
			}
		}
		return true, nil
	})

	// The project's counters arrived.
	waitUntil(t, 3*time.Minute, "the project's series", func() (bool, error) {
		res, err := promQuery(api, `count by (__name__) ({__name__=~"payouts_.+"})`)
		if err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, s := range res {
			seen[s.Metric["__name__"]] = true
		}
		var missing []string
		for _, name := range wantSeries {
			if !seen[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return false, fmt.Errorf("missing %v", missing)
		}
		return true, nil
	})
	if res, err := promQuery(api, `sum(payouts_rail_payments_total{status="settled"})`); err != nil || len(res) != 1 || res[0].Value != "1" {
		t.Errorf("settled payments at the rail through Prometheus: %+v, %v; want 1", res, err)
	}

	// Every series an alert counts the increase of is there, at 0, before
	// its first increase: a series born at its first event has no
	// increase to count, and the alert misses that event.
	for _, sel := range alertCounterSelectors(t) {
		if res, err := promQuery(api, sel); err != nil || len(res) == 0 {
			t.Errorf("%s, counted by an alert: %d series, %v; want it exported before its first increase", sel, len(res), err)
		}
	}

	// Every dashboard query runs against the real series.
	for _, q := range dashboardQueries(t) {
		if _, err := promQuery(api, q); err != nil {
			t.Errorf("dashboard query %s: %v", q, err)
		}
	}

	// The alert rules load and evaluate against real series.
	waitUntil(t, 3*time.Minute, "every rule group evaluated", func() (bool, error) {
		var body struct {
			Data struct {
				Groups []struct {
					Name  string `json:"name"`
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := promGet(api+"/api/v1/rules", &body); err != nil {
			return false, err
		}
		if len(body.Data.Groups) == 0 {
			return false, fmt.Errorf("no rule groups loaded")
		}
		for _, g := range body.Data.Groups {
			for _, rule := range g.Rules {
				if rule.Health != "ok" {
					return false, fmt.Errorf("%s/%s: health %q %s", g.Name, rule.Name, rule.Health, rule.LastError)
				}
			}
		}
		return true, nil
	})
}

// alertCounterSelectors are the series selectors the alert rules take the
// increase (or rate) of.
func alertCounterSelectors(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	for _, m := range regexp.MustCompile(`(?:increase|rate)\((payouts_[a-z_]+(?:\{[^}]*\})?)\[`).FindAllStringSubmatch(string(raw), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			out = append(out, m[1])
		}
	}
	if len(out) == 0 {
		t.Fatal("no increase() or rate() of a payouts_ series in alerts.yml: the pattern no longer reads it")
	}
	return out
}

// dashboardQueries reads every query of deploy/grafana/payouts.json, with
// Grafana's interval variables replaced.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "payouts.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h")
	var out []string
	var walk func([]json.RawMessage)
	walk = func(raws []json.RawMessage) {
		for _, r := range raws {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			for _, q := range p.Targets {
				out = append(out, vars.Replace(q.Expr))
			}
			walk(p.Panels)
		}
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	walk(dash.Panels)
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// requireTool finds a command a whole-system test needs. CI installs it
// (.ci/run); a missing tool fails the test rather than skipping it.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: install Debian's prometheus package (.ci/run does): %v", name, err)
	}
	return p
}

// startPrometheus runs a Prometheus server on loopback with a generated
// configuration that scrapes each role (job payouts-<role>) every second
// with the bearer token and loads deploy/prometheus/alerts.yml; it returns
// the server's URL and stops it at test end.
func startPrometheus(t *testing.T, bin string, targets map[string]string, token string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join("..", "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	roles := make([]string, 0, len(targets))
	for role := range targets {
		roles = append(roles, role)
	}
	sort.Strings(roles)
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	for _, role := range roles {
		fmt.Fprintf(&cfg, "  - job_name: payouts-%s\n    authorization: {type: Bearer, credentials_file: %q}\n    static_configs:\n      - targets: [%q]\n",
			role, tokenFile, targets[role])
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := infra.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	logPath := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- prometheus log, tail ---\n%s", tailLines(string(b), 30))
		}
	})
	api := "http://" + addr
	waitUntil(t, 5*time.Minute, "prometheus ready", func() (bool, error) {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited at start:\n%s", tailLines(string(b), 30))
		default:
		}
		resp, err := http.Get(api + "/-/ready")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return api
}

type promSample struct {
	Metric map[string]string
	Value  string
}

// promQuery runs an instant query and returns each sample's labels and value.
func promQuery(api, query string) ([]promSample, error) {
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := promGet(api+"/api/v1/query?query="+url.QueryEscape(query), &body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", query, body.Error)
	}
	out := make([]promSample, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		v, _ := r.Value[1].(string)
		out = append(out, promSample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

func promGet(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %v: %s", u, err, b)
	}
	return nil
}
