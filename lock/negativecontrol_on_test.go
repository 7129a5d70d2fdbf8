//go:build negativecontrol

package lock_test

// primariesRemoved: built with the negativecontrol switches (INV-06's
// mutual-exclusion condition removed from the PostgreSQL backend).
const primariesRemoved = true
