package reconcile

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
)

func TestTokensRegress(t *testing.T) {
	for _, c := range []struct {
		tokens []int64
		want   bool
	}{
		{nil, false},
		{[]int64{0, 5, 5, 5}, false},
		{[]int64{0, 5, 0, 7}, false},
		{[]int64{0, 9, 8}, true},
		{[]int64{0, 9, 0, 8}, true},
		{[]int64{3, 9, 9, 4, 10}, true},
	} {
		if got := tokensRegress(c.tokens); got != c.want {
			t.Errorf("tokensRegress(%v) = %v, want %v", c.tokens, got, c.want)
		}
	}
}

// pagesOf serves items as pages of n, the cursor being the index.
func pagesOf(items []string, n int) readPage[string] {
	return func(_ context.Context, cursor string) ([]string, string, error) {
		i := 0
		if cursor != "" {
			i, _ = strconv.Atoi(cursor)
		}
		end := min(i+n, len(items))
		next := ""
		if end < len(items) {
			next = strconv.Itoa(end)
		}
		return items[i:end], next, nil
	}
}

func TestStreamTakesEqualKeysAcrossPages(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := openStream(ctx, "test items", func(v string) string { return v }, pagesOf([]string{"a", "b", "b", "b", "d", "e"}, 2))
	var skipped []string
	skip := func(v string) { skipped = append(skipped, v) }
	for _, c := range []struct {
		key  string
		want []string
	}{{"b", []string{"b", "b", "b"}}, {"c", nil}, {"d", []string{"d"}}} {
		got, err := s.takeUpTo(c.key, skip)
		if err != nil || !slices.Equal(got, c.want) {
			t.Fatalf("takeUpTo(%q) = %v, %v; want %v", c.key, got, err, c.want)
		}
	}
	if !slices.Equal(skipped, []string{"a"}) {
		t.Fatalf("skipped %v, want [a]", skipped)
	}
	if v, ok, err := s.head(); v != "e" || !ok || err != nil {
		t.Fatalf("head = %q %v %v, want e", v, ok, err)
	}
	s.next()
	if _, ok, err := s.head(); ok || err != nil {
		t.Fatalf("past the end: ok %v, err %v", ok, err)
	}
}

// A source whose order is not byte order cannot be merged: the pass stops
// instead of reporting what it would have mismatched.
func TestStreamOutOfByteOrderCannotRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := openStream(ctx, "test items", func(v string) string { return v }, pagesOf([]string{"a", "c", "B"}, 2))
	_, err := s.takeUpTo("z", nil)
	if !errors.Is(err, ErrCannotRun) {
		t.Fatalf("out-of-order stream: %v, want ErrCannotRun", err)
	}
}
