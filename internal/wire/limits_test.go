package wire

import (
	"strings"
	"testing"
)

// An amount's refusal says what the field takes: an opening balance may be
// zero, a payout's amount may not.
func TestValidAmountSaysWhatItTakes(t *testing.T) {
	for _, c := range []struct {
		v         int64
		allowZero bool
		want      string // "" accepted
	}{
		{0, true, ""},
		{1, false, ""},
		{-5, true, "must be zero or a positive integer"},
		{0, false, "must be a positive integer"},
		{-5, false, "must be a positive integer"},
		{MaxAmount, true, "below 10^15"},
	} {
		err := ValidAmount("amount", c.v, c.allowZero)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%d (zero allowed %v): %v", c.v, c.allowZero, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%d (zero allowed %v): %v, want %q", c.v, c.allowZero, err, c.want)
		}
	}
}
