//go:build crashpoints

package executor

import "os"

// HooksFromEnv reads the test hooks (test builds only).
func HooksFromEnv() Hooks {
	return Hooks{HoldAfter: Point(os.Getenv(HoldAfterEnv)), CrashAfter: Point(os.Getenv(CrashAfterEnv))}
}

const hooksCompiledIn = true
