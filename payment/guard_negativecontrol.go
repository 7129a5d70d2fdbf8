//go:build negativecontrol

package payment

// guardEnabled reports whether this build carries guard 1's fence condition.
// This is the negative-control build: tests use it to show that, without the
// guard, a stale write lands and the detective controls fire. Never released.
const guardEnabled = false

// guardSQL without the fence condition: it still records the highest token
// seen (and its holder) but accepts every token, stale ones included.
const guardSQL = fenceAdvance + `
	RETURNING id, balance, fence_token, fence_holder, true`
