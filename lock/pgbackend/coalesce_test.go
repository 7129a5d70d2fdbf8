package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// gatedRun is a coalescer's statement for tests: it records each batch's
// keys and holds the first batch until the test opens the gate.
type gatedRun struct {
	mu      sync.Mutex
	batches [][]string
	started chan struct{} // closed when the first batch is running
	gate    chan struct{}
}

func newGatedRun() *gatedRun {
	return &gatedRun{started: make(chan struct{}), gate: make(chan struct{})}
}

func (g *gatedRun) run(_ context.Context, reqs []string) ([]string, error) {
	g.mu.Lock()
	g.batches = append(g.batches, slices.Clone(reqs))
	first := len(g.batches) == 1
	g.mu.Unlock()
	if first {
		close(g.started)
		<-g.gate
	}
	out := make([]string, len(reqs))
	for i, r := range reqs {
		out[i] = "answer:" + r
	}
	return out, nil
}

func (g *gatedRun) seen() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.batches)
}

func newTestCoalescer(run func(context.Context, []string) ([]string, error), max int) *coalescer[string, string] {
	return &coalescer[string, string]{slots: 1, max: max, run: run,
		key: func(r string) string { k, _, _ := cutAt(r); return k }}
}

// cutAt splits "key@caller" so that two callers can name one key.
func cutAt(r string) (string, string, bool) {
	for i := range len(r) {
		if r[i] == '@' {
			return r[:i], r[i+1:], true
		}
	}
	return r, "", false
}

// waitQueued waits, up to a generous deadline, until n calls are queued.
func waitQueued(t *testing.T, c *coalescer[string, string], n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for c.queued() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", c.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCallsThatArriveDuringAStatementShareTheNext: a call that finds the
// slot free runs alone at once; the calls that arrive while it runs go
// together in the next statement, one per key (a second call for a key
// waits for the statement after), at most max per statement; each caller
// gets its own answer.
func TestCallsThatArriveDuringAStatementShareTheNext(t *testing.T) {
	t.Parallel()
	g := newGatedRun()
	c := newTestCoalescer(g.run, 3)
	ctx := context.Background()
	answers := make(map[string]string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	ask := func(req string) {
		defer wg.Done()
		res, err := c.do(ctx, req)
		if err != nil {
			t.Errorf("%s: %v", req, err)
		}
		mu.Lock()
		answers[req] = res
		mu.Unlock()
	}
	wg.Add(1)
	go ask("k0")
	<-g.started
	later := []string{"k1", "k2", "k1@again", "k3", "k4"}
	for i, req := range later {
		wg.Add(1)
		go ask(req)
		waitQueued(t, c, i+1) // in this order
	}
	close(g.gate)
	wg.Wait()
	want := [][]string{{"k0"}, {"k1", "k2", "k3"}, {"k1@again", "k4"}}
	if got := g.seen(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statements %v, want %v", got, want)
	}
	for _, req := range append(later, "k0") {
		if answers[req] != "answer:"+req {
			t.Errorf("%s got %q", req, answers[req])
		}
	}
	// The last statement's goroutine gives the slot back after answering.
	deadline := time.Now().Add(time.Minute)
	for {
		c.mu.Lock()
		running, queued := c.running, len(c.queue)
		c.mu.Unlock()
		if running == 0 && queued == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the calls: %d running, %d queued; want none", running, queued)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestACallWhoseContextEndsWhileQueuedIsNotRun: a queued caller that gives
// up gets its context's error and is left out of the next statement.
func TestACallWhoseContextEndsWhileQueuedIsNotRun(t *testing.T) {
	t.Parallel()
	g := newGatedRun()
	c := newTestCoalescer(g.run, 8)
	go func() { _, _ = c.do(context.Background(), "first") }()
	<-g.started
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := c.do(ctx, "gives-up")
		gaveUp <- err
	}()
	waitQueued(t, c, 1)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller that gave up: %v, want context.Canceled", err)
	}
	stays := make(chan error, 1)
	go func() {
		_, err := c.do(context.Background(), "stays")
		stays <- err
	}()
	waitQueued(t, c, 2)
	close(g.gate)
	if err := <-stays; err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(g.seen()), fmt.Sprint([][]string{{"first"}, {"stays"}}); got != want {
		t.Errorf("statements %s, want %s", got, want)
	}
}

// TestAStatementErrorReachesEveryCallerOfItsBatch, and only them; a
// statement runs under the latest of its callers' deadlines, and is not
// cancelled when one caller's context is.
func TestAStatementErrorReachesEveryCallerOfItsBatch(t *testing.T) {
	t.Parallel()
	failed := errors.New("connection lost")
	var deadlines []time.Time
	var mu sync.Mutex
	started, gate := make(chan struct{}), make(chan struct{})
	n := 0
	c := newTestCoalescer(func(ctx context.Context, reqs []string) ([]string, error) {
		mu.Lock()
		n++
		first := n == 1
		d, _ := ctx.Deadline()
		deadlines = append(deadlines, d)
		mu.Unlock()
		if first {
			close(started)
			<-gate
			return []string{"ok"}, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("statement cancelled: %w", ctx.Err())
		}
		return nil, failed
	}, 8)
	go func() { _, _ = c.do(context.Background(), "first") }()
	<-started
	near := time.Now().Add(time.Hour)
	far := near.Add(time.Hour)
	ctxNear, cancelNear := context.WithDeadline(context.Background(), near)
	ctxFar, cancelFar := context.WithDeadline(context.Background(), far)
	defer cancelFar()
	errs := make(chan error, 2)
	go func() { _, err := c.do(ctxNear, "a"); errs <- err }()
	waitQueued(t, c, 1)
	go func() { _, err := c.do(ctxFar, "b"); errs <- err }()
	waitQueued(t, c, 2)
	close(gate)
	for range 2 {
		if err := <-errs; !errors.Is(err, failed) {
			t.Errorf("caller of the failed statement: %v, want %v", err, failed)
		}
	}
	cancelNear()
	mu.Lock()
	defer mu.Unlock()
	if len(deadlines) != 2 || !deadlines[1].Equal(far) {
		t.Errorf("statement deadlines %v, want the second at the later caller's %v", deadlines, far)
	}
}
