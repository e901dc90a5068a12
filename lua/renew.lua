-- renew.lua: the watchdog's batched renewal: set each holder's lease again, owner-checked.
--
-- KEYS[i]    lock hash i (on a cluster, every key of one call is in one slot)
-- ARGV[1]    lease in ms for every key
-- ARGV[1+i]  holder id expected to hold KEYS[i]
--
-- Returns  {r1, r2, ...}  ri = 1: KEYS[i] is held by its holder and its lease now ends ARGV[1]
--                         ms from now; ri = 0: it is not (expired, deleted, taken over, or
--                         replaced by foreign data), nothing changed for that key
--
-- No op record: like extend.lua, an absolute re-set of the lease is idempotent.
--
-- One read per key is the type check and the owner check: HEXISTS of a non-hash fails
-- (WRONGTYPE), which counts as not held. Any other error (an ACL refusal) fails the whole call,
-- so that the watchdog retries instead of taking every lock of the batch for lost.
local renewed = {}
for i, key in ipairs(KEYS) do
  local held = redis.pcall('HEXISTS', key, ARGV[i + 1])
  if type(held) == 'table' and held.err and string.sub(held.err, 1, 9) ~= 'WRONGTYPE' then
    return held
  end
  if held == 1 then
    redis.call('PEXPIRE', key, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
