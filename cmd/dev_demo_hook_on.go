//go:build crashpoints

package cmd

// demoHoldHook: this binary's executors honour the hold hook, so the demo
// can freeze a holder between its lease check and its write.
const demoHoldHook = true
