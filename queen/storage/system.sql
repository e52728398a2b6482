-- Broker-wide switches shared by every broker process (maintenance_mode,
-- pop_maintenance_mode), as small JSON documents under a key.
CREATE TABLE IF NOT EXISTS queen.system_state (
    key        text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
