package batcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// queued waits until n requests wait for a batch.
func queued[Req, Res any](t *testing.T, b *Batcher[Req, Res], n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if got := b.Waiting(); got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want %d", b.Waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// double answers each request twice its value, recording batch sizes; a
// batch holding a negative value waits for release first.
type double struct {
	mu      sync.Mutex
	sizes   []int
	release chan struct{}
	entered chan struct{}
}

func (d *double) write(_ context.Context, reqs []int) ([]int, error) {
	d.mu.Lock()
	d.sizes = append(d.sizes, len(reqs))
	d.mu.Unlock()
	out := make([]int, len(reqs))
	for i, r := range reqs {
		if r < 0 {
			d.entered <- struct{}{}
			<-d.release
		}
		out[i] = 2 * r
	}
	return out, nil
}

func newDouble() *double {
	return &double{release: make(chan struct{}), entered: make(chan struct{}, 1)}
}

func TestAnIdleBatcherWritesARequestAtOnceAlone(t *testing.T) {
	d := newDouble()
	b := New(d.write, Options{})
	for i := range 3 {
		if got, err := b.Do(context.Background(), i); err != nil || got != 2*i {
			t.Fatalf("Do(%d) = %d, %v", i, got, err)
		}
	}
	b.Wait()
	if fmt.Sprint(d.sizes) != "[1 1 1]" {
		t.Fatalf("batch sizes %v, want [1 1 1]", d.sizes)
	}
}

// Requests arriving while a batch is written go out together in the next
// one, each with its own answer, at most MaxBatch at a time.
func TestRequestsArrivingDuringAWriteGoOutTogether(t *testing.T) {
	d := newDouble()
	b := New(d.write, Options{MaxBatch: 4})
	first := make(chan int)
	go func() {
		v, _ := b.Do(context.Background(), -1)
		first <- v
	}()
	<-d.entered
	var wg sync.WaitGroup
	got := make([]int, 6)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := b.Do(context.Background(), i+1)
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	queued(t, b, 6)
	close(d.release)
	wg.Wait()
	if v := <-first; v != -2 {
		t.Fatalf("first answer %d, want -2", v)
	}
	for i, v := range got {
		if v != 2*(i+1) {
			t.Fatalf("answer %d = %d, want %d", i, v, 2*(i+1))
		}
	}
	b.Wait()
	if fmt.Sprint(d.sizes) != "[1 4 2]" {
		t.Fatalf("batch sizes %v, want [1 4 2]", d.sizes)
	}
}

func TestABatchErrorFailsEveryRequestOfTheBatch(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	b := New(func(_ context.Context, reqs []int) ([]int, error) {
		calls++
		if calls == 1 {
			return nil, boom
		}
		return make([]int, len(reqs)-1), nil // one answer short
	}, Options{})
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the batch's error", err)
	}
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, ErrShortAnswer) {
		t.Fatalf("Do = %v, want ErrShortAnswer", err)
	}
}

// A Func that panics fails its batch with ErrPanic, naming the panic; it
// runs in a goroutine of its own, so unrecovered it would end the process,
// and every request in flight with it. The batcher goes on writing.
func TestAPanickingBatchFailsItsRequestsOnly(t *testing.T) {
	calls := 0
	b := New(func(_ context.Context, reqs []int) ([]int, error) {
		calls++
		if calls == 1 {
			panic("a defect in the write")
		}
		return reqs, nil
	}, Options{})
	if _, err := b.Do(context.Background(), 1); !errors.Is(err, ErrPanic) || !strings.Contains(err.Error(), "a defect in the write") {
		t.Fatalf("Do = %v, want ErrPanic naming the panic", err)
	}
	if got, err := b.Do(context.Background(), 7); err != nil || got != 7 {
		t.Fatalf("Do after the panic = %d, %v; want 7", got, err)
	}
}

// A caller that goes away gets its context's error; the batch it was part
// of is still written for the others.
func TestACallerGoingAwayDoesNotFailTheBatch(t *testing.T) {
	d := newDouble()
	b := New(d.write, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := b.Do(ctx, -1)
		errc <- err
	}()
	<-d.entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	close(d.release)
	if v, err := b.Do(context.Background(), 5); err != nil || v != 10 {
		t.Fatalf("Do after = %d, %v", v, err)
	}
	b.Wait()
}

// With DropAbandoned, a caller that goes away while its request waits for
// a batch takes the request with it: no batch writes it (a lock release,
// say, that its caller was told failed and may try again). The others
// waiting go out. Without it, the request goes out with them.
func TestACallerLeavingBeforeItsBatchIsNotWritten(t *testing.T) {
	for _, drop := range []bool{true, false} {
		t.Run(fmt.Sprint("DropAbandoned=", drop), func(t *testing.T) { testCallerLeaving(t, drop) })
	}
}

func testCallerLeaving(t *testing.T, drop bool) {
	d := newDouble()
	var (
		mu      sync.Mutex
		written []int
	)
	b := New(func(ctx context.Context, reqs []int) ([]int, error) {
		mu.Lock()
		written = append(written, reqs...)
		mu.Unlock()
		return d.write(ctx, reqs)
	}, Options{DropAbandoned: drop})
	go func() { _, _ = b.Do(context.Background(), -1) }()
	<-d.entered
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := b.Do(ctx, 7)
		errc <- err
	}()
	queued(t, b, 1)
	stays := make(chan int)
	go func() {
		v, _ := b.Do(context.Background(), 8)
		stays <- v
	}()
	queued(t, b, 2)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	want, sizes, waiting := "[-1 7 8]", "[1 2]", 2
	if drop {
		want, sizes, waiting = "[-1 8]", "[1 1]", 1
	}
	if n := b.Waiting(); n != waiting {
		t.Fatalf("%d requests wait after the caller left", n)
	}
	close(d.release)
	if v := <-stays; v != 16 {
		t.Fatalf("the request that stayed answered %d, want 16", v)
	}
	b.Wait()
	if fmt.Sprint(written) != want || fmt.Sprint(d.sizes) != sizes {
		t.Fatalf("written %v in batches %v, want %s in %s", written, d.sizes, want, sizes)
	}
}

// At most Parallel batches are written at once.
func TestParallelBoundsTheBatchesInFlight(t *testing.T) {
	var (
		mu          sync.Mutex
		now, most   int
		gate        = make(chan struct{})
		entered     = make(chan struct{}, 8)
		wg          sync.WaitGroup
		parallelism = 2
	)
	b := New(func(_ context.Context, reqs []int) ([]int, error) {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		entered <- struct{}{}
		<-gate
		mu.Lock()
		now--
		mu.Unlock()
		return reqs, nil
	}, Options{Parallel: parallelism})
	do := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.Do(context.Background(), i); err != nil {
				t.Error(err)
			}
		}()
	}
	// One at a time until every batch slot is writing, then three more.
	for i := range parallelism {
		do(i)
		<-entered
	}
	for i := range 5 - parallelism {
		do(parallelism + i)
	}
	queued(t, b, 5-parallelism)
	close(gate)
	wg.Wait()
	b.Wait()
	if most != parallelism {
		t.Fatalf("%d batches written at once, want %d", most, parallelism)
	}
}

func TestDistinctSplitsRepeatedKeysIntoLaterRounds(t *testing.T) {
	keys := []string{"a", "b", "a", "c", "a", "b"}
	got := fmt.Sprint(Distinct(len(keys), func(i int) string { return keys[i] }))
	if got != "[[0 1 3] [2 5] [4]]" {
		t.Fatalf("rounds %s, want [[0 1 3] [2 5] [4]]", got)
	}
	if got := Distinct(0, func(int) int { return 0 }); len(got) != 0 {
		t.Fatalf("rounds of nothing: %v", got)
	}
}

// InRounds writes one round of distinct keys after another and answers
// each request with its round's result; a round that fails, or answers
// the wrong number of results, fails its requests and the later rounds',
// which are not written, and the earlier rounds keep their answers.
func TestInRoundsAnswersEachRequestFromItsRound(t *testing.T) {
	type res struct {
		round int
		err   error
	}
	reqs := []string{"a", "b", "a", "c", "a"}
	failed := func(err error) res { return res{err: err} }
	key := func(r string) string { return r }

	var written [][]string
	got := InRounds(reqs, key, failed, func(round []string) ([]res, error) {
		written = append(written, round)
		out := make([]res, len(round))
		for i := range out {
			out[i].round = len(written)
		}
		return out, nil
	})
	if fmt.Sprint(written) != "[[a b c] [a] [a]]" || fmt.Sprint(got) != "[{1 <nil>} {1 <nil>} {2 <nil>} {1 <nil>} {3 <nil>}]" {
		t.Fatalf("rounds %v, answers %v", written, got)
	}

	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		fail func(round []string) ([]res, error)
		err  error
	}{
		{"an error", func([]string) ([]res, error) { return nil, boom }, boom},
		{"a short answer", func(round []string) ([]res, error) { return make([]res, len(round)-1), nil }, ErrShortAnswer},
	} {
		written = nil
		got = InRounds(reqs, key, failed, func(round []string) ([]res, error) {
			written = append(written, round)
			if len(written) == 2 {
				return tc.fail(round)
			}
			return make([]res, len(round)), nil
		})
		if len(written) != 2 {
			t.Errorf("%s: %d rounds written, want 2 (none after the failed one)", tc.name, len(written))
		}
		for i, r := range got {
			want := error(nil)
			if i >= 2 && reqs[i] == "a" { // the second and third "a" are in the failed round and the one after
				want = tc.err
			}
			if !errors.Is(r.err, want) {
				t.Errorf("%s: request %d (%s) answered %v, want %v", tc.name, i, reqs[i], r.err, want)
			}
		}
	}
}

// TestWaitWhileCallsArrive: Wait may run while calls arrive, as at a
// server's shutdown while a handler still writes (a WaitGroup's Wait with a
// concurrent Add from zero is a misuse that may panic).
func TestWaitWhileCallsArrive(t *testing.T) {
	b := New(func(_ context.Context, reqs []int) ([]int, error) { return reqs, nil }, Options{})
	ctx := context.Background()
	for range 2000 {
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := b.Do(ctx, 1); err != nil {
				t.Error(err)
			}
		})
		wg.Go(b.Wait)
		wg.Go(b.Wait)
		wg.Wait()
	}
	b.Wait()
	if n := b.Writing(); n != 0 {
		t.Fatalf("%d batches writing after Wait", n)
	}
}
