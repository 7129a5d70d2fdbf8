//go:build !crashpoints

package cmd

// demoHoldHook: ordinary builds have no executor hold hook; the demo
// freezes a holder by timing instead.
const demoHoldHook = false
