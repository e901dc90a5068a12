-- extend.lua: the holder sets its lease to ARGV[2] ms from now.
--
-- KEYS[1]  lock hash
-- ARGV[1]  holder id
-- ARGV[2]  lease in ms      positive integer
--
-- Returns  {1}              the lease now ends ARGV[2] ms from now (this can shorten it)
--          {-1}             the holder does not hold the lock; nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write
--
-- No op record: setting an absolute lease is idempotent. A re-sent request that runs later
-- moves the server-side end later than the client believes, never earlier, and the client
-- measures its own deadline from the first send.
--
-- One read is the type check and the owner check: HEXISTS of a non-hash fails (WRONGTYPE),
-- answered by refused() (lib/calls.lua, prepended by the loader) before anything is written.
local held = redis.pcall('HEXISTS', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return refused(held, 'lock key is not a fencelock hash')
end
if held == 0 then
  return {-1}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1}
