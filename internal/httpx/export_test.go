package httpx

// For the package's external tests.
var (
	NewTransport      = newTransport
	ReadHeaderTimeout = readHeaderTimeout
)
