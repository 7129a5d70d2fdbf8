-- proxydb: resolvable_after (00003) is written with the intent and never
-- changed. It says how long a submission without outcome may still be
-- sent; shortened, a lookup would record ABSENT while a proxy may still
-- send it. 00001's write-once trigger predates the column, so a trigger of
-- its own guards it, under the same constraint name as the other identity
-- columns.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION rail_submission_resolvable_after_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.resolvable_after IS DISTINCT FROM OLD.resolvable_after THEN
        RAISE EXCEPTION 'rail_submission %: resolvable_after is written with the intent and never changed', OLD.id
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'rail_submission_identity_immutable', TABLE = 'rail_submission';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER rail_submission_resolvable_after_fixed
    BEFORE UPDATE OF resolvable_after ON rail_submission
    FOR EACH ROW EXECUTE FUNCTION rail_submission_resolvable_after_fixed();

-- +goose Down
DROP TRIGGER rail_submission_resolvable_after_fixed ON rail_submission;
DROP FUNCTION rail_submission_resolvable_after_fixed();
