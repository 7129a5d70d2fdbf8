//go:build negativecontrol

package railproxy

// highWaterSQL is guard 2 WITHOUT its fence condition: a negative control
// for tests only, never in a release build. It still records the highest
// token seen (never moving the mark backwards) but accepts a stale token, so
// a test can show the detective controls catch what the guard would have
// stopped.
const highWaterSQL = highWaterAdvance + `
RETURNING hw.token, hw.holder, true`

// guardEnabled reports whether the fence condition is compiled in.
const guardEnabled = false
