package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// e2eAmount is every payout's amount; accounts are funded for all of theirs.
const e2eAmount = 100

// terminalTransitions are the transitions that end an executor's work on a
// payout (RAIL_AMBIGUOUS waits for the reconciler, which the bench does
// not run; none is expected without rail faults).
var terminalTransitions = []string{string(pc.Posted), string(pc.Failed), string(pc.Abandoned), string(pc.RailAmbiguous)}

func runE2E(ctx context.Context, o E2EOptions, sys *e2eSystem) (E2EResult, error) {
	log := o.Logger
	run := "e2e" + strconv.FormatInt(time.Now().UnixNano()/1e6, 36)
	opClients := make([]*pc.Client, len(sys.paymentURLs))
	for i, u := range sys.paymentURLs {
		c, err := pc.New(u, sys.operatorToken, httpx.WithTimeout(time.Minute))
		if err != nil {
			return E2EResult{}, err
		}
		opClients[i] = c
	}
	rail, ms, err := sys.operatorRail(ctx, o)
	if err != nil {
		return E2EResult{}, err
	}

	log.Info("loading accounts", "accounts", o.Accounts)
	perAccount := int64((o.Payouts+o.Accounts-1)/o.Accounts) * e2eAmount
	if err := parallel(ctx, o.Accounts, o.LoadWorkers, func(ctx context.Context, i int) error {
		_, err := opClients[i%len(opClients)].CreateAccount(ctx, pc.CreateAccountRequest{
			ID: e2eAccountID(run, i), Currency: "EUR", OpeningBalance: perAccount * 2,
		})
		return err
	}); err != nil {
		return E2EResult{}, fmt.Errorf("load accounts: %w", err)
	}
	if err := sys.waitExecutors(ctx); err != nil {
		return E2EResult{}, err
	}
	base, err := terminalCount(ctx, sys.paymentURLs)
	if err != nil {
		return E2EResult{}, err
	}
	if err := sys.cpu.start(); err != nil {
		return E2EResult{}, err
	}
	held, err := sys.throttled()
	if err != nil {
		return E2EResult{}, err
	}
	prof := sys.startProfiles(ctx, o)

	log.Info("creating payouts", "payouts", o.Payouts, "offered_rate", o.Rate)
	start := time.Now()
	loadErr, stopLoad := startLoad(ctx, o, run, start, func(ctx context.Context, i int, p pc.CreatePayoutRequest) error {
		_, err := opClients[i%len(opClients)].CreatePayout(ctx, p)
		return err
	})
	defer stopLoad()
	if err := sys.waitTerminal(ctx, o, base, loadErr); err != nil {
		return E2EResult{}, err
	}
	elapsed := time.Since(start)
	cpu, err := sys.cpu.since()
	if err != nil {
		return E2EResult{}, err
	}
	heldAfter, err := sys.throttled()
	if err != nil {
		return E2EResult{}, err
	}
	loadavg := loadAvg()
	prof.stop()

	res := E2EResult{
		Payouts: o.Payouts, Accounts: o.Accounts, Executors: o.Executors, Concurrency: o.Concurrency,
		Replicas: len(sys.paymentURLs), RailLatencyMs: ms, OfferedRate: o.Rate, LoadAvg: loadavg,
		CPUPer1000: map[string]float64{},
	}
	for name, d := range cpu {
		res.CPUPer1000[name] = round3(d.Seconds() * 1000 / float64(o.Payouts))
	}
	if len(sys.caps) > 0 {
		res.RoleCPUs, res.Throttled = o.RoleCPUs, map[string]float64{}
		for name, d := range heldAfter {
			res.Throttled[name] = round3((d - held[name]).Seconds())
		}
	}
	if err := collectLatencies(ctx, opClients[0], run, o.Payouts, &res); err != nil {
		return res, err
	}
	if res.Seconds == 0 {
		res.Seconds = elapsed.Seconds()
	}
	res.PayoutsPerSec = round3(float64(o.Payouts) / res.Seconds)
	res.Duplicates, err = railDuplicates(ctx, rail, pc.ClientRef(run+"-"))
	return res, err
}

func e2eAccountID(run string, i int) string { return fmt.Sprintf("%s-a%06d", run, i) }
func e2ePayoutID(run string, i int) string  { return fmt.Sprintf("%s-p%08d", run, i) }

// parallel calls fn for 0..n-1 from workers goroutines; the first error
// stops the rest.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// waitExecutors waits until every executor has opened its lock session.
func (sys *e2eSystem) waitExecutors(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for _, c := range sys.procs.all {
		if !strings.HasPrefix(c.Name, "executor-") {
			continue
		}
		for {
			b, _ := os.ReadFile(c.Spec.Log)
			if strings.Contains(string(b), "lock session opened") {
				break
			}
			if c.Exited() {
				return fmt.Errorf("%s exited during start; see %s", c.Name, c.Spec.Log)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not open a lock session within 2m; see %s", c.Name, c.Spec.Log)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// waitTerminal waits until the payment resources have made o.Payouts more
// terminal transitions than base (waitFor).
func (sys *e2eSystem) waitTerminal(ctx context.Context, o E2EOptions, base int, loadErr <-chan error) error {
	return sys.waitFor(ctx, o, loadErr, terminalPoll, func(ctx context.Context) (int, error) {
		n, err := terminalCount(ctx, sys.paymentURLs)
		return n - base, err
	})
}

// waitFor waits until terminal, read every poll, reports o.Payouts
// terminal payouts, a loader fails, a child process exits, or o.Timeout
// passes.
func (sys *e2eSystem) waitFor(ctx context.Context, o E2EOptions, loadErr <-chan error, poll time.Duration, terminal func(context.Context) (int, error)) error {
	deadline := time.Now().Add(o.Timeout)
	lastLog := time.Now()
	for {
		n, err := terminal(ctx)
		if err != nil {
			return err
		}
		if n >= o.Payouts {
			return nil
		}
		if time.Since(lastLog) > 5*time.Second {
			o.Logger.Info("waiting for payouts to become terminal", "terminal", n, "payouts", o.Payouts)
			lastLog = time.Now()
		}
		for _, c := range sys.procs.all {
			if c.Exited() {
				return fmt.Errorf("%s exited during the run; see %s", c.Name, c.Spec.Log)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d payouts terminal after %s", n, o.Payouts, o.Timeout)
		}
		select {
		case err := <-loadErr:
			if err != nil {
				return fmt.Errorf("create payouts: %w", err)
			}
			loadErr = nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// metricsClient reads /metrics uncompressed: gzip would cost the
// measured process CPU that the workload does not.
var metricsClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}, Timeout: 30 * time.Second}

// terminalPoll is how often waitTerminal reads the payment resources'
// /metrics. A scrape also counts paydb's open payouts by state (and, once a
// minute, the finished ones), which the measured processes pay for; the end of the run
// is read back from the payouts' own timestamps, so polling more often
// would only add that cost.
const terminalPoll = time.Second

// terminalCount sums the payment resources' transitions into a terminal
// state, read from their /metrics.
func terminalCount(ctx context.Context, urls []string) (int, error) {
	total := 0
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := metricsClient.Do(req)
		if err != nil {
			return 0, fmt.Errorf("read %s/metrics: %w", u, err)
		}
		n, err := sumTransitions(resp)
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("read %s/metrics: %w", u, err)
		}
		total += n
	}
	return total, nil
}

func sumTransitions(resp *http.Response) (int, error) {
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	total := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "payouts_payment_transitions_total{") {
			continue
		}
		for _, st := range terminalTransitions {
			if strings.Contains(line, `to="`+st+`"`) {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					return 0, fmt.Errorf("bad sample %q", line)
				}
				total += int(v)
			}
		}
	}
	return total, sc.Err()
}

// collectLatencies lists the run's payouts and fills in latencies, the run
// time and the per-second timeline. A POSTED payout ends at settled_at; a
// payout that ended otherwise ends at its last event.
func collectLatencies(ctx context.Context, c *pc.Client, run string, want int, res *E2EResult) error {
	spans := make([]span, 0, want)
	prefix := run + "-p"
	after := prefix
	for {
		page, err := c.Payouts(ctx, pc.PayoutFilter{After: after, Limit: 1000})
		if err != nil {
			return fmt.Errorf("list payouts: %w", err)
		}
		done := len(page.Items) == 0
		for _, p := range page.Items {
			if !strings.HasPrefix(p.ID, prefix) {
				done = true
				break
			}
			end, err := payoutEnd(ctx, c, p, res)
			if err != nil {
				return err
			}
			s := span{created: p.CreatedAt, ended: end}
			if p.ClaimedAt != nil {
				s.claimed = *p.ClaimedAt
			}
			spans = append(spans, s)
		}
		if done || page.Next == "" {
			break
		}
		after = page.Next
	}
	if len(spans) != want {
		return fmt.Errorf("found %d of the run's %d payouts", len(spans), want)
	}
	summarize(spans, res)
	return nil
}

// span is one payout's life: created, claimed (zero if it never was) and
// terminal.
type span struct{ created, claimed, ended time.Time }

// summarize fills a result's duration (first created to last terminal),
// latency quantiles and timeline from the payouts' spans, and, from the
// spans that were claimed, the quantiles of the wait to be claimed and of
// the path from claimed to terminal.
func summarize(spans []span, res *E2EResult) {
	first, last := spans[0].created, spans[0].ended
	lat := make([]float64, len(spans))
	for i, s := range spans {
		if s.created.Before(first) {
			first = s.created
		}
		if s.ended.After(last) {
			last = s.ended
		}
		lat[i] = ms(s.ended.Sub(s.created))
	}
	res.Seconds = round3(last.Sub(first).Seconds())
	sorted := append([]float64(nil), lat...)
	sort.Float64s(sorted)
	res.P50Ms, res.P99Ms, res.MaxMs = round3(quantile(sorted, 0.50)), round3(quantile(sorted, 0.99)), round3(sorted[len(sorted)-1])
	var waits, paths []float64
	for _, s := range spans {
		if !s.claimed.IsZero() {
			waits = append(waits, ms(s.claimed.Sub(s.created)))
			paths = append(paths, ms(s.ended.Sub(s.claimed)))
		}
	}
	if len(waits) > 0 {
		sort.Float64s(waits)
		sort.Float64s(paths)
		res.ClaimWaitP50Ms, res.ClaimWaitP99Ms = round3(quantile(waits, 0.50)), round3(quantile(waits, 0.99))
		res.PathP50Ms, res.PathP99Ms = round3(quantile(paths, 0.50)), round3(quantile(paths, 0.99))
	}
	secs := int(last.Sub(first)/time.Second) + 1
	res.Timeline = make([]E2ESecond, secs)
	perSec := make([][]float64, secs)
	for i, s := range spans {
		res.Timeline[int(s.created.Sub(first)/time.Second)].Created++
		k := int(s.ended.Sub(first) / time.Second)
		res.Timeline[k].Done++
		perSec[k] = append(perSec[k], lat[i])
	}
	for k, l := range perSec {
		if len(l) > 0 {
			sort.Float64s(l)
			res.Timeline[k].P50Ms, res.Timeline[k].P99Ms = quantile(l, 0.50), quantile(l, 0.99)
		}
	}
}

func payoutEnd(ctx context.Context, c *pc.Client, p pc.Payout, res *E2EResult) (time.Time, error) {
	switch p.State {
	case pc.Posted:
		res.Posted++
		if p.SettledAt != nil {
			return *p.SettledAt, nil
		}
	case pc.Failed, pc.Abandoned:
		res.Failed++
	case pc.RailAmbiguous:
		res.Ambiguous++
	default:
		return time.Time{}, fmt.Errorf("payout %s is %s after the run", p.ID, p.State)
	}
	evs, err := c.PayoutEvents(ctx, p.ID, 0, 1000)
	if err != nil {
		return time.Time{}, fmt.Errorf("payout %s events: %w", p.ID, err)
	}
	if len(evs.Items) == 0 {
		return time.Time{}, errors.New("payout " + p.ID + " has no events")
	}
	return evs.Items[len(evs.Items)-1].At, nil
}

// quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[nearestRank(len(sorted), q)]
}

// nearestRank is the index of the q-quantile of n sorted values by nearest
// rank: the ceil(q·n)-th value, at least the first.
func nearestRank(n int, q float64) int {
	i := int(math.Ceil(q*float64(n)-1e-9)) - 1
	return max(0, min(i, n-1))
}

// operatorRail is the rail stub as the bench's operator sees it, with
// o.RailLatency (ms, returned) set for the run about to start: the payouts
// run and the baseline's alike.
func (sys *e2eSystem) operatorRail(ctx context.Context, o E2EOptions) (*railclient.Client, int64, error) {
	rail, err := railclient.New(sys.railURL, sys.operatorToken, httpx.WithTimeout(5*time.Minute))
	if err != nil {
		return nil, 0, err
	}
	ms := o.RailLatency.Milliseconds()
	if _, err := rail.SetFaults(ctx, railclient.FaultsUpdate{LatencyMS: &ms}); err != nil {
		return nil, 0, fmt.Errorf("set the rail's latency: %w", err)
	}
	return rail, ms, nil
}

// railDuplicates reads the rail's settlement report and counts the client
// references with the given prefix it settled more than once.
func railDuplicates(ctx context.Context, rail *railclient.Client, prefix string) (int, error) {
	// Page by page, keeping the run's payments only: the whole report of a
	// stack that ran many rounds (or an external rail's history) outgrows
	// what one answer may be.
	var run []railclient.Payment
	after := ""
	for {
		page, err := rail.SettlementReportPage(ctx, after, 0)
		if err != nil {
			return 0, fmt.Errorf("read the rail's settlement report: %w", err)
		}
		for _, p := range page.Items {
			if strings.HasPrefix(p.ClientRef, prefix) {
				run = append(run, p)
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return countDuplicates(run, prefix), nil
		}
		after = page.Next
	}
}

// countDuplicates counts client references with the given prefix that the
// rail settled more than once.
func countDuplicates(report []railclient.Payment, prefix string) int {
	seen := map[string]int{}
	for _, p := range report {
		if strings.HasPrefix(p.ClientRef, prefix) && p.Status == "settled" {
			seen[p.ClientRef]++
		}
	}
	dups := 0
	for _, n := range seen {
		if n > 1 {
			dups++
		}
	}
	return dups
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

func splitFields(s string) []string { return strings.Fields(s) }

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
