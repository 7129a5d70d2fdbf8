//go:build !negativecontrol

package negativecontrol

// primariesRemoved: a release build; every primary is in place and each
// scenario must land nothing.
const primariesRemoved = false
