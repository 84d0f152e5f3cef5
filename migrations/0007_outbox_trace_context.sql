-- The W3C trace context of the span an event was emitted in, so that the trace of the request
-- that wrote the event continues in the consumers that handle it (docs/tracing.md).
--
--   traceparent  `00-<trace id>-<parent id>-<flags>`, as the `traceparent` header carries it;
--                null when the event was emitted outside any traced span, or by a service
--                built without outbox-runtime's `opentelemetry` feature
--   tracestate   the vendors' `tracestate` list that came with it, or null
--
-- Both are nullable and have no default, so adding them rewrites nothing, and a writer that
-- does not name them (the contract's own insert) leaves them null. The seed's columns are
-- untouched. The relay puts them in the envelope (the CloudEvents `traceparent`/`tracestate`
-- extension attributes); a relay on a table without them publishes as before and says at
-- start that traces are not carried.
alter table outbox_events
  add column if not exists traceparent text null,
  add column if not exists tracestate  text null;
