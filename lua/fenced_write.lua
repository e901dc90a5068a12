-- fenced_write.lua: apply one write to a resource only if the writer's fencing token is not
-- older than any token the resource has accepted, and remember the newest token.
--
-- KEYS[1]  resource data    string (set, incrby), hash (hset) or list (rpush); any type (del)
-- KEYS[2]  high-water mark  string: the highest token that wrote or claimed this resource (the
--                           exclusive mark); no expiry unless the resource has a retention
-- KEYS[3]  op record        string: this write's reply, kept ARGV[2] ms so a re-sent request
--                           replays instead of applying twice (an increment must not double)
-- KEYS[4]  shared mark      string: the highest token that read the resource with a shared
--                           read (fenced_read.lua); read here, never written (but its expiry
--                           kept with the others')
-- ARGV[1]  token            positive integer below 2^53
-- ARGV[2]  op record lifetime in ms
-- ARGV[3]  kind             "set" | "incrby" | "hset" | "rpush" | "del"
-- ARGV[4]  retention        ms the resource's keys are kept after this write; "0": no expiry
-- ARGV[5..] payload         set: value; incrby: integer delta; hset: field, value, ...;
--                           rpush: element, ...; del: nothing
--
-- Returns  {1, result}      accepted (token >= both marks): the write was applied and the
--                           exclusive mark is now max(mark, token); result is the new number
--                           for incrby (exact, as text), the new length for rpush, 0
--                           otherwise (a replay answers it as text); with a
--                           retention, data and marks now expire ARGV[4] ms from now
--          {0, latest, by}  stale (token below a mark): nothing was written; latest is the
--                           higher mark, by 1 when it is the shared mark (a newer reader
--                           read), 0 when the exclusive one (a newer holder wrote or claimed);
--                           or, with a retention and no mark left, by 2 and latest the oldest
--                           token accepted: this one was issued at or before server time
--                           minus the retention (lib/fence_mark.lua)
--
-- Errors   FENCELOCK_WRONGTYPE  a key holds a type this write cannot apply to; nothing modified
--          FENCELOCK_BADARG     the token, delta or retention is not a valid integer; nothing
--                           modified
--
-- ">=" and not ">": one holder writes many times with the same token. The marks are keys of
-- their own so that deleting the data (kind "del", or an operator) does not reset the fence.
-- A write below the shared mark is refused because a reader with a newer token has read the
-- resource: its hold began after this writer's ended (lib/fence_mark.lua).
--
-- Uses fence_mark(), data_check() and keep_for() from lib/fence_mark.lua, which the loader
-- prepends to this file.
-- The recorded reply as text: an incrby's result may be past 2^53, where a Lua number is
-- inexact.
local done = redis.call('GET', KEYS[3])
if done then
  return {1, done}
end

-- A write is an exclusive call: refused below either mark.
local token, exclusive, shared = fence_mark(ARGV[1], KEYS[2], KEYS[4], 'claim', ARGV[4])
if not token then
  return exclusive
end

local kind = ARGV[3]
local wanted = (kind == 'set' or kind == 'incrby') and 'string' or kind == 'hset' and 'hash'
  or kind == 'rpush' and 'list'
if wanted then
  local refused = data_check(KEYS[1], wanted, kind == 'incrby' and 'a number' or nil)
  if refused then
    return refused
  end
elseif kind ~= 'del' then
  return redis.error_reply('FENCELOCK_BADARG unknown write kind ' .. tostring(kind))
end

if kind == 'incrby' then
  local delta = tonumber(ARGV[5])
  local current = tonumber(redis.call('GET', KEYS[1]) or '0')
  if not delta or delta % 1 ~= 0 then
    return redis.error_reply('FENCELOCK_BADARG delta must be an integer')
  end
  if current == nil then
    return redis.error_reply('FENCELOCK_WRONGTYPE resource does not hold an integer')
  end
end
-- The write is the kind's own command (Redis takes command names in any case) on the data,
-- with the payload; its reply is the result only for incrby and rpush. INCRBY's reply reaches
-- Lua as a double, inexact past 2^53: the number as stored is the exact one.
local result
if kind == 'rpush' or kind == 'hset' then
  -- In slices of 1000 values (whole field-value pairs for hset): unpack() of more than about
  -- 8000 overflows Lua's stack. Still one script, so still atomic; the last reply is rpush's
  -- length.
  for first = 5, #ARGV, 1000 do
    result = redis.call(kind, KEYS[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
  end
else
  result = redis.call(kind, KEYS[1], unpack(ARGV, 5))
end
if kind == 'incrby' then
  result = redis.call('GET', KEYS[1])
elseif kind ~= 'rpush' then
  result = 0
end

if token > exclusive then
  redis.call('SET', KEYS[2], ARGV[1])
end
keep_for(ARGV[4], KEYS[1], KEYS[2], KEYS[4])
redis.call('SET', KEYS[3], result, 'PX', ARGV[2])
return {1, result}
