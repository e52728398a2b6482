-- When each queue name was last deleted, so the spool replay can drop items spooled before
-- the deletion instead of creating the queue again for them. One row per name; rows older
-- than 30 days are pruned whenever a queue is deleted.
CREATE TABLE IF NOT EXISTS queen.deleted_queues (
    name       text PRIMARY KEY,
    deleted_at timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION queen.remember_deleted_queues() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO queen.deleted_queues (name, deleted_at)
    SELECT DISTINCT g.name, clock_timestamp() FROM gone g
    ON CONFLICT (name) DO UPDATE SET deleted_at = excluded.deleted_at;
    DELETE FROM queen.deleted_queues WHERE deleted_at < clock_timestamp() - interval '30 days';
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER queues_remember_deleted AFTER DELETE ON queen.queues
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION queen.remember_deleted_queues();
