-- Broker-wide switches shared by every broker process (maintenance_mode,
-- pop_maintenance_mode), as small JSON documents under a key.
CREATE TABLE IF NOT EXISTS queen.system_state (
    key        text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Per minute, queue and broker process: what that process stored, popped (and how long the
-- popped messages had waited), found empty and had acknowledged (queen/flow.py). Every process
-- writes its own rows, absolute figures, every few seconds (queen/storage/flow.py); the admin
-- reads add the processes up; the flushes delete the minutes past the hour.
CREATE TABLE IF NOT EXISTS queen.queue_flow (
    minute       timestamptz NOT NULL,
    queue_name   text NOT NULL,
    process      text NOT NULL,
    pushes       bigint NOT NULL,
    pops         bigint NOT NULL,
    lag_sum_s    double precision NOT NULL,
    lag_max_s    double precision NOT NULL,
    empty_pops   bigint NOT NULL,
    acks         bigint NOT NULL,
    acks_refused bigint NOT NULL,
    PRIMARY KEY (minute, queue_name, process)
);
