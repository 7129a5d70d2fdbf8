package bench

import "testing"

// TestNearestRank: the q-quantile of n sorted values is the ceil(q·n)-th
// (one-based), whether or not q·n is whole: the lock bench took the
// floor and the e2e bench rounded, each one rank low for most n.
func TestNearestRank(t *testing.T) {
	for _, c := range []struct {
		n    int
		q    float64
		want int // zero-based index
	}{
		{1, 0.99, 0}, {2, 0.5, 0}, {3, 0.5, 1}, {100, 0.99, 98}, {160, 0.99, 158},
		{101, 0.99, 99}, {199, 0.5, 99}, {20000, 0.99, 19799}, {7, 0.0, 0}, {7, 1.0, 6},
	} {
		if got := nearestRank(c.n, c.q); got != c.want {
			t.Errorf("nearestRank(%d, %v) = %d, want %d", c.n, c.q, got, c.want)
		}
	}
}
