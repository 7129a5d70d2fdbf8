package reconcile

import (
	"context"
	"fmt"
)

// ---- sorted streams, read ahead ----

// readPage reads the page after cursor ("" for the first) and returns its
// items and the cursor of the next page ("" when it was the last).
type readPage[T any] func(ctx context.Context, cursor string) (items []T, next string, err error)

type pageResult[T any] struct {
	items []T
	err   error
}

// stream is a list read page by page in the order of key (byte order),
// the next page read while the current one is worked on. What it holds is
// at most two pages. It checks that the keys never go down: the merge of
// several streams is only correct when they share one order. A stream
// that is not merged has no key.
type stream[T any] struct {
	what  string
	key   func(T) string
	pages chan pageResult[T]
	buf   []T
	i     int
	last  string
	begun bool
	done  bool
}

// openStream starts reading ahead; the reader stops when ctx ends.
func openStream[T any](ctx context.Context, what string, key func(T) string, read readPage[T]) *stream[T] {
	s := &stream[T]{what: what, key: key, pages: make(chan pageResult[T], 1)}
	go func() {
		defer close(s.pages)
		cursor := ""
		for {
			items, next, err := read(ctx, cursor)
			select {
			case s.pages <- pageResult[T]{items: items, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil || next == "" || len(items) == 0 {
				return
			}
			cursor = next
		}
	}()
	return s
}

// head is the current item; ok is false at the end of the stream.
func (s *stream[T]) head() (item T, ok bool, err error) {
	for s.i >= len(s.buf) {
		if s.done {
			return item, false, nil
		}
		pg, open := <-s.pages
		if !open {
			s.done = true
			return item, false, nil
		}
		if pg.err != nil {
			s.done = true
			return item, false, cannotRun("read "+s.what, pg.err)
		}
		for _, it := range pg.items {
			if s.key == nil {
				break
			}
			k := s.key(it)
			if s.begun && k < s.last {
				s.done = true
				return item, false, fmt.Errorf("%w: %s came out of byte order (%q after %q): the streams cannot be merged", ErrCannotRun, s.what, k, s.last)
			}
			s.last, s.begun = k, true
		}
		s.buf, s.i = pg.items, 0
	}
	return s.buf[s.i], true, nil
}

// next moves past the current item.
func (s *stream[T]) next() { s.i++ }

// rest calls fn for every item left.
func (s *stream[T]) rest(fn func(T)) error {
	for {
		it, ok, err := s.head()
		if err != nil || !ok {
			return err
		}
		fn(it)
		s.next()
	}
}

// takeUpTo calls skip for every item whose key is below key, then returns
// the items whose key equals it (a fresh slice).
func (s *stream[T]) takeUpTo(key string, skip func(T)) ([]T, error) {
	var out []T
	for {
		it, ok, err := s.head()
		if err != nil || !ok {
			return out, err
		}
		k := s.key(it)
		switch {
		case k < key:
			if skip != nil {
				skip(it)
			}
		case k == key:
			out = append(out, it)
		default:
			return out, nil
		}
		s.next()
	}
}
