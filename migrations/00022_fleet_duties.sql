-- Fleet duties: work the fleet needs done once, not once per instance (the
-- maintenance: reclaiming abandoned claims, marking renewals, housekeeping; and the
-- fleet statistics behind the alerts). Each duty is held by one instance at a time
-- under a lease it renews every time it does the work (queue.TakeDuty); the others
-- skip the work while the lease holds, and take the duty over when it runs out (an
-- instance that died, or stopped reaching the database). A row per duty, written a
-- few times a minute: nothing of the proxy's is touched or locked.
--
-- A lease row rather than a session advisory lock: it needs no session of its own,
-- and an instance that is alive but stuck (a frozen process keeps its connection and
-- a session lock with it) loses the duty when its lease runs out.

-- +goose Up
CREATE TABLE IF NOT EXISTS certworker_fleet_duties (
    duty       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS certworker_fleet_duties;
