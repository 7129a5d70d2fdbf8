//go:build !negativecontrol

package lock_test

// primariesRemoved: a release build; mutual exclusion is in place.
const primariesRemoved = false
