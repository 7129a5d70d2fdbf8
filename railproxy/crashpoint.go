//go:build !crashpoints

package railproxy

// crashPointFromEnv is empty in ordinary builds: the proxy never crashes on
// purpose. Build with -tags crashpoints to enable PAYOUTS_PROXY_CRASH_POINT.
func crashPointFromEnv() string { return "" }
