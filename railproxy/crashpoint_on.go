//go:build crashpoints

package railproxy

import "os"

// CrashPointEnv names the environment variable that, in a binary built with
// -tags crashpoints, makes the proxy exit with status 3 at a crash point:
// after_intent (intent committed, rail not yet called) or after_rail_answer
// (the rail answered, the outcome not yet recorded). Test builds only.
const CrashPointEnv = "PAYOUTS_PROXY_CRASH_POINT"

func crashPointFromEnv() string { return os.Getenv(CrashPointEnv) }
