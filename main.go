// Command payouts pays money out through a non-idempotent rail at most once
// per payout, using fencing tokens checked by two independent guards.
package main

import (
	"os"

	"github.com/payouts/payouts/cmd"
)

func main() { os.Exit(cmd.Execute()) }
