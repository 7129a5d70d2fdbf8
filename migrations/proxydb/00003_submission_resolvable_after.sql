-- proxydb: how long after its intent a submission may still be sent, as the
-- proxy that wrote it was configured (its send window and rail timeout).
-- A lookup resolves a submission without outcome only once it is older
-- than that and than its own proxy's: proxies with different flags (a
-- rolling change of --rail-timeout, a replica started otherwise) would
-- otherwise resolve ABSENT a submission another may still send. NULL for
-- rows written before: the looking proxy's own window applies.

-- +goose Up
ALTER TABLE rail_submission ADD COLUMN resolvable_after interval;

-- +goose Down
ALTER TABLE rail_submission DROP COLUMN resolvable_after;
