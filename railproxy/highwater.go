package railproxy

// highWaterAdvance moves an account's high-water mark to the highest
// (token, holder) seen: the token to GREATEST(stored, presented), the holder
// with it only when the token goes up. Guard 2 (highWaterSQL, guard.go) is
// this statement plus the condition that judges the submission.
const highWaterAdvance = `
INSERT INTO account_high_water AS hw (account_id, token, holder, updated_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (account_id) DO UPDATE
   SET token = GREATEST(hw.token, EXCLUDED.token),
       holder = CASE WHEN EXCLUDED.token > hw.token THEN EXCLUDED.holder ELSE hw.holder END,
       updated_at = now()`
