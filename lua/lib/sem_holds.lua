-- lib/sem_holds.lua: shared by the scripts of holds with leases of their own (sem_acquire.lua,
-- sem_release.lua, sem_handoff.lua, sem_cancel.lua, sem_renew.lua, rw_acquire.lua,
-- rw_downgrade.lua); the loader (src/protocol/scripts.rs) prepends it to each.
--
-- A semaphore is a hash, and on the lease-zset path a zset, in one slot (a read-write lock is
-- a semaphore whose writer takes every permit, plus the zset of its waiting writers:
-- rw_acquire.lua):
--   hash  "~limit" -> permits in all,
--         <holder id> -> "<permits>:<token>", one field per live hold; "<permits>:<token>:<label>"
--         when its acquisition was given a label (an operator's tag: sem_acquire.lua ARGV[10],
--         rw_acquire.lua ARGV[9]). The label lives in the hold's own field, so it ends with
--         the hold on every path (release, cancel, a purge, an operator's release, the
--         server's field expiry) and costs no field, expiry or command of its own
--         "~entries:<holder id>" -> its entries, only while a hold was entered again through
--         its guard (hold_reenter.lua): at least 2; absent means 1
--         lease zset path only: "~used" -> permits held now (the sum over the holds)
--         lease zset path only: "~until" -> when both keys expire (server ms, sem_set_deadline)
--         field-expiry path only: "~expiry" -> "fields"
--   zset  lease zset path only: <holder id> -> the hold's lease deadline, in server ms
--
-- Two ways to keep one deadline per hold, chosen when a semaphore is created and kept in it
-- until it is gone:
--   lease zset (every server): the zset above. Every script that reads or changes the holds
--     first drops the holds whose deadline passed (sem_purge), so a crashed holder's permits
--     come back within its lease without any sweeper; "~used" is kept with every change.
--   field expiry (Redis 7.4+, Valkey 9.0+; the creating acquisition asks for it): a hold's
--     field and its "~entries:" field carry the deadline as their own expiry (HPEXPIREAT), and
--     the server drops them when it passes. No "~used": the server drops fields without any
--     script running, so the permits in use are the sum over the live holds' fields (HVALS).
--     The hash records "~expiry" -> "fields"; the zset is never written. The hash expires no
--     earlier than its latest deadline (extended, never shortened: a semaphore whose holds
--     left early keeps its "~limit" until then) and is deleted when its last hold is released
--     (sem_settle).
-- Every script reads the way from the hash (sem_open), so clients that would choose
-- differently (one configured for the zset, or connected before the server was upgraded)
-- share a semaphore correctly. With the zset, both keys expire no earlier than the latest
-- deadline: a grant or renewal whose deadline is after the keys' expiry ("~until") moves it a
-- lease beyond that deadline (sem_set_deadline), so the holds granted and renewed during the
-- next lease leave it alone, and a release leaves it too (never shortened: a release that
-- left other holds would need a read of the zset and two writes to move it earlier). Keys
-- whose holders all vanished so outlive the last deadline by at most one lease. Either way a semaphore nobody holds
-- any more disappears, limit included, and nothing stays behind per holder: the release of
-- the last hold deletes it (sem_settle).
--
-- A script opens the semaphore once (sem_open): one HMGET reads the way, the limit, "~used"
-- and the holder's fields, and on the lease-zset path one ZRANGEBYSCORE lists the expired
-- holds. Those two reads also check the keys' types, through their own WRONGTYPE errors
-- (pcall) rather than a TYPE per key; what a script changes afterwards keeps USED current, so
-- no script reads the hash twice for the same question.

-- Whether the semaphore being worked on keeps its deadlines as field expiry; set by sem_open.
local FIELD_EXPIRY = false

-- The most fields of a field-expiry hash that sem_settle looks through for a live hold.
local SETTLE_SCAN_FIELDS = 10

-- Lease zset path only: the permits held now ("~used"), as sem_open read it and every change
-- below keeps it (sem_grant, sem_drop, sem_change_permits), so it is read once per script.
local USED = 0

-- Lease zset path only: when both keys expire ("~until", server ms; 0 when not recorded), and
-- the script's clock (server ms), as sem_open read them.
local KEYS_UNTIL = 0
local NOW = 0

-- The limit the hash records ("~limit"; nil: none), as sem_open read it: a grant writes it
-- only when it differs.
local RECORDED_LIMIT = nil

-- An integer's decimal text. A number given to redis.call is formatted with "%.17g" (Redis
-- 6.2 and 7.0), and Lua's own tostring with "%.14g": both take glibc's floating-point path,
-- several times the cost of "%d", and a hot script formats a few numbers per call.
local function int_text(n)
  return string.format('%d', n)
end

-- The server clock in milliseconds (the deadlines' clock); `t`, optional: the reply of a TIME
-- the script already made (which it can then give next_token too: one call less).
local function now_ms(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The server clock in microseconds, as decimal text (a fair queue's order).
local function micros_now()
  local t = redis.call('TIME')
  return string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- The permits held now: USED on the lease-zset path. With field expiry, the sum over the
-- holds' values ("<permits>:<token>", or "<permits>:<token>:<label>": the number before the
-- first colon; the "~" fields hold no colon).
local function sem_used(hash)
  if not FIELD_EXPIRY then
    return USED
  end
  local used = 0
  for _, value in ipairs(redis.call('HVALS', hash)) do
    local permits = string.match(value, '^(%d+):')
    if permits then
      used = used + tonumber(permits)
    end
  end
  return used
end

-- A hold's deadline (server ms), nil when it has none (no such hold).
local function sem_deadline(hash, leases, holder)
  if FIELD_EXPIRY then
    local at = redis.call('HPEXPIRETIME', hash, 'FIELDS', 1, holder)[1]
    return at > 0 and at or nil
  end
  return tonumber(redis.call('ZSCORE', leases, holder))
end

-- The FENCELOCK_WRONGTYPE reply for `key` (`what` it should be: `wanted`), naming what it
-- holds; or `reply` itself when the call failed for another reason (an ACL refusal).
local function sem_refusal(reply, key, what, wanted)
  if string.sub(reply.err, 1, 9) ~= 'WRONGTYPE' then
    return reply
  end
  local kind = redis.call('TYPE', key)['ok']
  return redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' holds a ' .. kind .. ', not ' .. wanted)
end

-- Opens the semaphore at `hash` (with its lease zset `leases`) for a script, at server time
-- `now` (ms), for `holder` (nil: none). Sets FIELD_EXPIRY from the hash's "~expiry"; for a
-- semaphore that does not exist yet `wanted` ("fields" or anything else) decides it, if this
-- server runs HPEXPIRETIME (a cluster node not yet upgraded, or a user not granted it, gets
-- the zset: a script that failed at its first HPEXPIREAT would keep a hold without a
-- deadline). Returns a table, or nil and an error reply (nothing written):
--   limit    the recorded "~limit" (nil: none recorded)
--   held     the holder's field (false: none)
--   live     whether the holder holds now: its field is there and its deadline is after `now`
--   entries  the holder's entries ("~entries:<holder id>", 1 without that field)
--   expired  lease zset path: the holders whose deadline is at or before `now` (sem_purge)
-- A key of another type fails the call that reads it, caught here, so neither key costs a
-- TYPE when both are right. With field expiry the zset is never read: its type is checked
-- with TYPE, so a foreign key under its name is refused and never deleted (sem_settle).
local function sem_open(hash, leases, holder, now, wanted)
  local got
  if holder then
    got = redis.pcall('HMGET', hash, '~expiry', '~limit', '~used', '~until', holder, '~entries:' .. holder)
  else
    got = redis.pcall('HMGET', hash, '~expiry', '~limit', '~used', '~until')
  end
  if got.err then
    return nil, sem_refusal(got, hash, 'semaphore key', 'a fencelock hash')
  end
  if got[1] then
    FIELD_EXPIRY = got[1] == 'fields'
  elseif wanted == 'fields' and redis.call('EXISTS', hash) == 0 then
    local probe = redis.pcall('HPEXPIRETIME', hash, 'FIELDS', 1, '~expiry')
    FIELD_EXPIRY = type(probe) == 'table' and probe.err == nil
  else
    FIELD_EXPIRY = false
  end
  RECORDED_LIMIT = tonumber(got[2])
  local state = {
    limit = RECORDED_LIMIT,
    held = holder and got[5] or false,
    entries = holder and tonumber(got[6]) or 1,
    expired = {},
  }
  if FIELD_EXPIRY then
    local kind = redis.call('TYPE', leases)['ok']
    if kind ~= 'zset' and kind ~= 'none' then
      return nil, redis.error_reply('FENCELOCK_WRONGTYPE semaphore lease key holds a ' .. kind .. ', not a sorted set')
    end
    state.live = state.held and (sem_deadline(hash, leases, holder) or 0) > now
    return state
  end
  local expired = redis.pcall('ZRANGEBYSCORE', leases, '-inf', int_text(now))
  if expired.err then
    return nil, sem_refusal(expired, leases, 'semaphore lease key', 'a sorted set')
  end
  state.expired = expired
  USED = tonumber(got[3]) or 0
  KEYS_UNTIL = tonumber(got[4]) or 0
  NOW = now
  state.live = state.held and true or false
  for _, gone in ipairs(expired) do
    if gone == holder then
      state.live = false
    end
  end
  return state
end

-- Lease zset path: after a deadline went into the zset, moves the keys' expiry (and
-- "~until") one lease beyond it when it passes "~until".
local function sem_set_deadline_after_zadd(hash, leases, deadline)
  if deadline > KEYS_UNTIL then
    KEYS_UNTIL = deadline + math.max(deadline - NOW, 0)
    local until_text = int_text(KEYS_UNTIL)
    redis.call('HSET', hash, '~until', until_text)
    redis.call('PEXPIREAT', hash, until_text)
    redis.call('PEXPIREAT', leases, until_text)
  end
end

-- Sets a live hold's deadline (server ms); with field expiry its entries field's too. The
-- keys' own expiry is extended to it when it is the latest (never shortened: header); with
-- the zset, when it is after "~until", to one lease (`deadline` - NOW) beyond it.
local function sem_set_deadline(hash, leases, holder, deadline)
  if FIELD_EXPIRY then
    redis.call('HPEXPIREAT', hash, deadline, 'FIELDS', 2, holder, '~entries:' .. holder)
    if redis.call('PEXPIRETIME', hash) < deadline then
      redis.call('PEXPIREAT', hash, deadline)
    end
  else
    redis.call('ZADD', leases, int_text(deadline), holder)
    sem_set_deadline_after_zadd(hash, leases, deadline)
  end
end

-- A hold's field value: "<permits>:<token>", then ":<label>" when `label` is given.
local function sem_hold_value(permits, token_text, label)
  if label then
    return permits .. ':' .. token_text .. ':' .. label
  end
  return permits .. ':' .. token_text
end

-- A hold's permits (a number), token (decimal text) and label (nil without one) from its
-- field value. The first two colons end the permits and the token; a label may hold colons
-- (and digits after them) of its own.
local function sem_hold_parse(value)
  local permits, token_text, rest = string.match(value, '^(%d+):(%d+)(.*)$')
  local label = nil
  if rest ~= '' then
    label = string.sub(rest, 2)
  end
  return tonumber(permits), token_text, label
end

-- A new hold of `permits` with its token and `label` (nil: none) and the semaphore's `limit`
-- (recorded), until `deadline`; the keys expire no earlier than it.
local function sem_grant(hash, leases, holder, permits, token_text, label, limit, deadline)
  local value = sem_hold_value(permits, token_text, label)
  if FIELD_EXPIRY then
    redis.call('HSET', hash, holder, value, '~limit', limit, '~expiry', 'fields')
  else
    USED = USED + permits
    if RECORDED_LIMIT == limit then
      redis.call('HSET', hash, holder, value, '~used', int_text(USED))
    else
      redis.call('HSET', hash, holder, value, '~limit', int_text(limit), '~used', int_text(USED))
      RECORDED_LIMIT = limit
    end
  end
  sem_set_deadline(hash, leases, holder, deadline)
end

-- New holds of one permit each, all until `deadline`: `grants` lists {holder, token_text,
-- label} (label nil: none). As sem_grant for each, in one HSET and one ZADD on the lease-zset
-- path (rw_read_many.lua).
local function sem_grant_ones(hash, leases, grants, limit, deadline)
  if FIELD_EXPIRY then
    for _, grant in ipairs(grants) do
      sem_grant(hash, leases, grant[1], 1, grant[2], grant[3], limit, deadline)
    end
    return
  end
  USED = USED + #grants
  local fields, members = {}, {}
  local deadline_text = int_text(deadline)
  for k, grant in ipairs(grants) do
    fields[2 * k - 1], fields[2 * k] = grant[1], sem_hold_value(1, grant[2], grant[3])
    members[2 * k - 1], members[2 * k] = deadline_text, grant[1]
  end
  fields[#fields + 1], fields[#fields + 2] = '~used', int_text(USED)
  if RECORDED_LIMIT ~= limit then
    fields[#fields + 1], fields[#fields + 2] = '~limit', int_text(limit)
    RECORDED_LIMIT = limit
  end
  redis.call('HSET', hash, unpack(fields))
  redis.call('ZADD', leases, unpack(members))
  sem_set_deadline_after_zadd(hash, leases, deadline)
end

-- A live hold of `from` permits keeps its token, label and deadline with `to` permits.
local function sem_change_permits(hash, leases, holder, from, to, token_text, label)
  local deadline = sem_deadline(hash, leases, holder)
  -- HSET clears a field's own expiry: set it again.
  redis.call('HSET', hash, holder, sem_hold_value(to, token_text, label))
  if FIELD_EXPIRY then
    redis.call('HPEXPIREAT', hash, deadline, 'FIELDS', 1, holder)
  else
    USED = redis.call('HINCRBY', hash, '~used', to - from)
  end
end

-- Records that a live hold has `entries` entries (1: the field goes).
local function sem_set_entries(hash, leases, holder, entries)
  local field = '~entries:' .. holder
  if entries > 1 then
    redis.call('HSET', hash, field, entries)
    if FIELD_EXPIRY then
      redis.call('HPEXPIREAT', hash, sem_deadline(hash, leases, holder), 'FIELDS', 1, field)
    end
  else
    redis.call('HDEL', hash, field)
  end
end

-- Removes one hold; returns the permits it had (0 when it was not there). `held`, optional:
-- the hold's field as the caller just read it (false: absent), so it is not read again.
local function sem_drop(hash, leases, holder, held)
  if not FIELD_EXPIRY then
    redis.call('ZREM', leases, holder)
  end
  if held == nil then
    held = redis.call('HGET', hash, holder)
  end
  if not held then
    return 0
  end
  local permits_text = string.match(held, '^(%d+):')
  redis.call('HDEL', hash, holder, '~entries:' .. holder)
  if not FIELD_EXPIRY then
    USED = redis.call('HINCRBY', hash, '~used', '-' .. permits_text)
  end
  return tonumber(permits_text)
end

-- Drops every hold that sem_open found expired (`state.expired`); returns the permits freed.
-- With field expiry the server drops them itself (nothing to do, 0 freed); it judges a field
-- by the time the script began, so a hold whose deadline passes while a script runs counts as
-- held until that script ends: for microseconds, and on the safe side.
local function sem_purge(hash, leases, state)
  local freed = 0
  for _, holder in ipairs(state.expired) do
    freed = freed + sem_drop(hash, leases, holder)
  end
  state.expired = {}
  return freed
end

-- The part of a holder's release that does not end its hold (sem_release.lua, sem_handoff.lua),
-- on the semaphore `state` that sem_open read for `holder`: replays a release that left
-- entries (its reply kept in its op record `record`), or takes one entry of a hold entered
-- more than once (the record keeps the entries left, `ttl` ms). Drops expired holds first, so
-- a holder whose lease ended holds nothing. Returns that reply, or nil and the hold's field
-- (false: no live hold) for the caller to end.
local function sem_leave_entry(hash, leases, holder, record, ttl, state)
  local done = redis.call('GET', record)
  if done then
    return {1, tonumber(done)}, nil
  end
  sem_purge(hash, leases, state)
  if not state.live then
    return nil, false
  end
  if state.entries > 1 then
    local remaining = state.entries - 1
    sem_set_entries(hash, leases, holder, remaining)
    redis.call('SET', record, remaining, 'PX', ttl)
    return {1, remaining}, nil
  end
  return nil, state.held
end

-- After a change that may have ended holds: deletes a semaphore with no hold left (the keys'
-- expiry is left as it is: the header says why). With the zset "no hold left" is USED at 0;
-- with field expiry it is judged by HLEN, which may still count a field the server has not
-- reclaimed yet; such a hash goes at its own expiry.
local function sem_settle(hash, leases)
  if FIELD_EXPIRY then
    -- "~limit" and "~expiry" are the only fields of a hash without holds. HLEN also counts a
    -- field whose expiry passed but that the server has not reclaimed yet (a crashed
    -- holder's), which HKEYS leaves out: a small hash is looked through for a live hold, so
    -- the release of the last one deletes it, limit included, rather than leaving it to its
    -- own expiry. A large one (many holds) is not, to keep each change O(1) there.
    local fields = redis.call('HLEN', hash)
    if fields > 2 and fields <= SETTLE_SCAN_FIELDS then
      fields = 2
      for _, field in ipairs(redis.call('HKEYS', hash)) do
        if string.sub(field, 1, 1) ~= '~' then
          fields = 3
          break
        end
      end
    end
    if fields <= 2 then
      redis.call('DEL', hash, leases)
    end
    return
  end
  if USED <= 0 then
    redis.call('DEL', hash, leases)
  end
end

-- The earliest deadline among the live holds (server ms), nil when none is held.
local function sem_earliest(hash, leases)
  if not FIELD_EXPIRY then
    return tonumber(redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')[2])
  end
  local holders = {}
  for _, field in ipairs(redis.call('HKEYS', hash)) do
    if string.sub(field, 1, 1) ~= '~' then
      holders[#holders + 1] = field
    end
  end
  if #holders == 0 then
    return nil
  end
  local first = nil
  for _, at in ipairs(redis.call('HPEXPIRETIME', hash, 'FIELDS', #holders, unpack(holders))) do
    if at > 0 and (not first or at < first) then
      first = at
    end
  end
  return first
end

-- Announces that permits came back, so that waiters go to Redis again: on the hash's channel,
-- and on the waiting writers' channel `writers` of a read-write lock (nil for a semaphore).
local function sem_publish(hash, mode, writers)
  local command = mode == 'sharded' and 'SPUBLISH' or 'PUBLISH'
  redis.call(command, hash, 'released')
  if writers then
    redis.call(command, writers, 'released')
  end
end
