-- +goose Up
-- Observability: the trace context captured when a run starts (a W3C traceparent, say),
-- so that every execution of the run, on any worker, after any sleep, joins the trace
-- of the request that started it. Set by Config.Hooks (see kagziotel); NULL without them.
-- It is not a payload: the payload codec does not apply to it.
ALTER TABLE kagzi.runs ADD COLUMN trace_carrier jsonb;

-- +goose Down
ALTER TABLE kagzi.runs DROP COLUMN trace_carrier;
