-- +goose Up
-- A pass of history drops marks the day it drops before (dropping_before), and the
-- archiver moves no run that finished before the mark: a run archived into a day
-- while the day was being checked and dropped was lost with it (found in review: a
-- namespace that began archiving in the middle of another's drop pass lost its runs'
-- steps, signals and listing entries). The archiver reads the mark FOR SHARE, so the
-- pass's marking waits for the archiving under way, and every archiving after it sees
-- the mark. The lease row always exists, so that there is always a row to lock.
ALTER TABLE kagzi.history_drops ADD COLUMN dropping_before timestamptz;
INSERT INTO kagzi.history_drops (holder, until) VALUES ('', '-infinity') ON CONFLICT DO NOTHING;

-- +goose Down
ALTER TABLE kagzi.history_drops DROP COLUMN dropping_before;
