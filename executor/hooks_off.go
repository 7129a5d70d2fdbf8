//go:build !crashpoints

package executor

// HooksFromEnv returns no hooks: ordinary builds never hold or crash on
// purpose. Build with -tags crashpoints to honour the test hook variables.
func HooksFromEnv() Hooks { return Hooks{} }

const hooksCompiledIn = false
