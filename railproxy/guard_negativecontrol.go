//go:build negativecontrol

package railproxy

// highWaterSQL is guard 2 WITHOUT its fence condition: a negative control
// for tests only, never in a release build. It still records the highest
// token seen (never moving the mark backwards) but accepts a stale token, so
// a test can show the detective controls catch what the guard would have
// stopped.
const highWaterSQL = `
INSERT INTO account_high_water AS hw (account_id, token, holder, updated_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (account_id) DO UPDATE
   SET token = GREATEST(hw.token, EXCLUDED.token),
       holder = CASE WHEN EXCLUDED.token > hw.token THEN EXCLUDED.holder ELSE hw.holder END,
       updated_at = now()
RETURNING hw.token, hw.holder, true`

// guardEnabled reports whether the fence condition is compiled in.
const guardEnabled = false
