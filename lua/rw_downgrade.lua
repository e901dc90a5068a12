-- rw_downgrade.lua: a writer becomes a reader of the same read-write lock, with no moment in
-- between where another writer could take it.
--
-- KEYS[1]  lock hash        (layout in lib/sem_holds.lua and rw_acquire.lua; readers' channel)
-- KEYS[2]  lease zset
-- ARGV[1]  holder id        the writer's
-- ARGV[2]  pub/sub mode     "sharded" publishes with SPUBLISH, else PUBLISH
--
-- Returns  {1}              the holder now holds one permit (a read) with its writer's token,
--                           label and lease (the holder id stays, so does the label); waiting readers were told on KEYS[1]. Also the reply
--                           when it already was a reader (a re-sent downgrade)
--          {-1}             the holder holds nothing here (its lease ended, an operator
--                           released it); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- Idempotent by state, without an op record: a second copy finds the hold already at one
-- permit. Waiting writers are not woken: a reader still holds the lock. The loader prepends
-- lib/clock.lua and lib/sem_holds.lua to this file.
local sem, err = sem_open(KEYS[1], KEYS[2], ARGV[1], now_ms(), nil)
if not sem then
  return err
end
sem_purge(KEYS[1], KEYS[2], sem)
if not sem.live then
  return {-1}
end
local permits, token_text, label = sem_hold_parse(sem.held)
if permits > 1 then
  -- The hold keeps its token, label and deadline with one permit. HSET clears a field's own
  -- expiry: it is read first and set again (the zset's deadline stays as it is).
  local deadline = FIELD_EXPIRY and sem_deadline(KEYS[1], KEYS[2], ARGV[1])
  redis.call('HSET', KEYS[1], ARGV[1], sem_hold_value(1, token_text, label))
  if FIELD_EXPIRY then
    redis.call('HPEXPIREAT', KEYS[1], deadline, 'FIELDS', 1, ARGV[1])
  else
    redis.call('HINCRBY', KEYS[1], '~used', 1 - permits)
  end
  sem_publish(KEYS[1], ARGV[2], nil)
end
return {1}
