-- lib/fence_mark.lua: shared by fenced_read.lua and fenced_write.lua; the loader
-- (src/protocol/scripts.rs) prepends it to each of them, since Redis scripts cannot import. It
-- calls no other library, as lib/next_token.lua does not (each function a script defines costs
-- its every call: lib/calls.lua): its WRONGTYPE refusal (refused() there) and its clock
-- (micros() of lib/clock.lua) are in line.
--
-- A resource has two marks. The exclusive mark is the highest token that wrote to it or read
-- it with a claim (a holder alone in its critical section); the shared mark is the highest
-- token that read it with a shared read (readers of one read-write lock, who hold it
-- together). An exclusive operation is refused below either mark; a shared read only below the
-- exclusive one, so readers never refuse each other.
--
-- A resource may be kept for a retention (FencedResource::with_retention): then every key of
-- it expires together, that long after its last accepted call, and while it has no mark a
-- token issued before the retention began is refused (fence_mark, keep_for below).
--
-- read_mark(key, what): one GET under redis.pcall, so the type check rides on the read
-- instead of costing a TYPE per mark on every fenced call.
local function read_mark(key, what)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    return nil, string.sub(raw.err, 1, 9) ~= 'WRONGTYPE' and raw
      or redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' is not a string')
  end
  local mark = tonumber(raw or '0')
  if mark == nil then
    return nil, redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' does not hold an integer')
  end
  return mark
end

-- fence_mark(token_arg, mark_key, shared_key, mode, retention_arg): whether a call with the
-- presented token may act on the resource. In this order: parses the token, reads both marks,
-- checks the mode ("claim": an exclusive call, a write or a claim; "shared": a shared read;
-- anything else is FENCELOCK_BADARG, "unknown read mode") and the retention argument (ms, "0":
-- none; else FENCELOCK_BADARG), and judges the token. Returns token, exclusive mark, shared
-- mark (0 where a mark is missing) when it may act; else nil and an error reply or the refusal
-- {0, latest, by} (nothing has been modified). An exclusive call is refused below either mark
-- (latest: the higher; by 1 when it is the shared one, else 0), a shared read only below the
-- exclusive mark (by 0).
--
-- The retention's floor: a resource kept for a retention refuses, while it has no mark at all,
-- every token up to server time minus the retention, in microseconds (by 2, latest the oldest
-- token accepted). Its marks expire `retention` ms after its last accepted call, so a resource
-- without marks has seen no call for that long: every token that wrote or claimed it since is
-- gone with them, and a token issued before now - retention may be older than one of those.
-- Tokens carry their issue time as a floor (microseconds of server TIME, lib/next_token.lua),
-- so that floor refuses every hold that began before the marks' last refresh.
local function fence_mark(token_arg, mark_key, shared_key, mode, retention_arg)
  local token = tonumber(token_arg)
  if not token or token < 1 or token >= 9007199254740992 or token % 1 ~= 0 then
    return nil, redis.error_reply('FENCELOCK_BADARG fencing token must be a positive integer below 2^53')
  end
  local exclusive, err = read_mark(mark_key, 'high-water mark')
  local shared
  if exclusive then
    shared, err = read_mark(shared_key, 'shared mark')
  end
  if not shared then
    return nil, err
  end
  local sharing = mode == 'shared'
  if not sharing and mode ~= 'claim' then
    return nil, redis.error_reply('FENCELOCK_BADARG unknown read mode ' .. tostring(mode))
  end
  local mark = sharing and exclusive or math.max(exclusive, shared)
  if token < mark then
    return nil, {0, mark, (not sharing and shared > exclusive) and 1 or 0}
  end
  local retention = tonumber(retention_arg)
  if not retention or retention < 0 or retention % 1 ~= 0 then
    return nil, redis.error_reply('FENCELOCK_BADARG retention must be a whole number of ms')
  end
  if retention == 0 or exclusive > 0 or shared > 0 then
    return token, exclusive, shared
  end
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2]) - retention * 1000
  if token <= floor then
    return nil, {0, floor + 1, 2}
  end
  return token, exclusive, shared
end

-- data_check(key, wanted, noun): the TYPE of a resource's data before a call that needs it to
-- hold a `wanted` ("string", "hash", "list") or nothing: nil then, else FENCELOCK_WRONGTYPE
-- naming what it holds ("..., not <noun>"; noun: "a <wanted>" unless given).
local function data_check(key, wanted, noun)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= wanted then
    return redis.error_reply('FENCELOCK_WRONGTYPE resource holds a ' .. kind .. ', not ' .. (noun or 'a ' .. wanted))
  end
end

-- keep_for(retention_arg, ...): after an accepted call on a resource kept for a retention,
-- each of its keys that exists (data, marks) expires `retention` ms from now, all together, so
-- the marks never outlive nor predecease each other. Nothing for a retention of "0".
local function keep_for(retention_arg, ...)
  if retention_arg ~= '0' then
    for _, key in ipairs({...}) do
      redis.call('PEXPIRE', key, retention_arg)
    end
  end
end
