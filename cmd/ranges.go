package cmd

import (
	"fmt"
	"math"
	"strconv"

	"github.com/spf13/cobra"
)

// intRange is the values an integer flag (int, int32 or int64) may take,
// both ends included.
type intRange struct {
	name   string
	lo, hi int
}

// checkFlagRanges refuses, as a usage error (exit 2), an int flag outside
// its range or a duration flag that is not positive. A library's zero
// means "the default", but a 0 or a negative given on the command line is
// a mistake to say, not a value to replace quietly.
func checkFlagRanges(c *cobra.Command, ints []intRange, positiveDurations ...string) error {
	fl := c.Flags()
	for _, r := range ints {
		f := fl.Lookup(r.name)
		if f == nil {
			return fmt.Errorf("no flag --%s", r.name)
		}
		v, err := strconv.Atoi(f.Value.String())
		if err != nil {
			return fmt.Errorf("--%s is not an integer flag: %w", r.name, err)
		}
		if v < r.lo || v > r.hi {
			if r.hi == math.MaxInt {
				return &ExitError{Code: 2, Err: fmt.Errorf("--%s must be at least %d, got %d", r.name, r.lo, v)}
			}
			return &ExitError{Code: 2, Err: fmt.Errorf("--%s must be from %d to %d, got %d", r.name, r.lo, r.hi, v)}
		}
	}
	return checkDurations(c, false, positiveDurations...)
}

// checkNonNegativeDurations refuses, as a usage error (exit 2), a negative
// value of a duration flag whose 0 means something (no settlement window,
// keep the grant log forever): a negative one was taken as 0 without a word.
func checkNonNegativeDurations(c *cobra.Command, names ...string) error {
	return checkDurations(c, true, names...)
}

// checkDurations refuses a duration flag below 0, or at 0 unless zeroOK.
func checkDurations(c *cobra.Command, zeroOK bool, names ...string) error {
	for _, name := range names {
		d, err := c.Flags().GetDuration(name)
		if err != nil {
			return err
		}
		switch {
		case zeroOK && d < 0:
			return &ExitError{Code: 2, Err: fmt.Errorf("--%s must be 0 or more, got %s", name, d)}
		case !zeroOK && d <= 0:
			return &ExitError{Code: 2, Err: fmt.Errorf("--%s must be positive, got %s", name, d)}
		}
	}
	return nil
}
