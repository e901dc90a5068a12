-- lib/sem_holds.lua: shared by the scripts of holds with leases of their own (sem_acquire.lua,
-- sem_release.lua, sem_release_many.lua, sem_handoff.lua, sem_cancel.lua, sem_renew.lua,
-- sem_limit.lua, hold_reenter.lua, rw_acquire.lua, rw_read_many.lua, rw_downgrade.lua); the
-- loader (src/protocol/scripts.rs) prepends it to each, after lib/clock.lua (whose int_text()
-- it uses). Taking a hold is lib/sem_take.lua's, leaving one lib/sem_give.lua's: each script
-- gets only the libraries it calls, since each function a script defines costs its every call
-- (lib/calls.lua), and so does each table it makes, so the functions a single operation runs
-- make none beyond their replies. A grouped script (sem_release_many.lua, rw_read_many.lua)
-- answers each of its operations with the function that operation's own script calls, and
-- does once what they share: the clock, sem_open for every holder, the purge, the writes of
-- its grants or of the holds it ends, the settling of the keys and the wake-up.
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
-- whose holders all vanished so outlive the last deadline by at most one lease. Either way a
-- semaphore nobody holds any more disappears, limit included, and nothing stays behind per
-- holder: the release of the last hold deletes it (sem_settle).
--
-- A script opens the semaphore once (sem_open): one HMGET reads the way, the limit, "~used"
-- and the fields of the holders it acts for, and on the lease-zset path one ZRANGEBYSCORE
-- lists the expired holds (for a single operation on a semaphore whose hash holds none of its
-- fields, one EXISTS of every other key it reads instead, when none exists: `others`). Those
-- two reads also check the keys' types, through their own WRONGTYPE errors
-- (pcall) rather than a TYPE per key; what a script changes afterwards keeps USED current, so
-- no script reads the hash twice for the same question.

-- Whether the semaphore being worked on keeps its deadlines as field expiry; set by sem_open.
local FIELD_EXPIRY = false

-- The most fields of a field-expiry hash that sem_settle looks through for a live hold.
local SETTLE_SCAN_FIELDS = 10

-- Lease zset path only: the permits held now ("~used"), as sem_open read it and every change
-- below keeps it (sem_grant, sem_drop), so it is read once per script.
local USED = 0

-- Lease zset path only: when both keys expire ("~until", server ms; 0 when not recorded), and
-- the script's clock (server ms), as sem_open read them.
local KEYS_UNTIL = 0
local NOW = 0

-- The limit the hash records ("~limit"; nil: none), as sem_open read it: a grant writes it
-- only when it differs.
local RECORDED_LIMIT = nil

-- The permits held now: USED on the lease-zset path. With field expiry, the sum over the
-- holds' values ("<permits>:<token>", or "<permits>:<token>:<label>": the number before the
-- first colon; the "~" fields hold no colon).
local function sem_used(hash)
  if not FIELD_EXPIRY then
    return USED
  end
  local used = 0
  for _, value in ipairs(redis.call('HVALS', hash)) do
    used = used + tonumber(string.match(value, '^(%d+):') or 0)
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

-- The TYPE of `key`, which must hold a `kind` ("zset", "hash") or nothing: that kind, or nil
-- and FENCELOCK_WRONGTYPE ("<what> holds a <its kind>, not a sorted set" or "..., not a
-- fencelock hash"). `reply`, optional: the error of a read of the key, which this answers: its
-- WRONGTYPE so, any other error (an ACL refusal) as it is. A read of the right command is the
-- type check of the hash and, on the lease-zset path, of the zset (sem_open); this TYPE checks
-- the keys no read of theirs does (the zset with field expiry, a read-write lock's waiting
-- writers, a fair semaphore's queue).
local function sem_typed(key, kind, what, reply)
  if reply and string.sub(reply.err, 1, 9) ~= 'WRONGTYPE' then
    return nil, reply
  end
  local found = redis.call('TYPE', key)['ok']
  if reply or (found ~= 'none' and found ~= kind) then
    local wanted = kind == 'zset' and 'a sorted set' or 'a fencelock ' .. kind
    return nil, redis.error_reply('FENCELOCK_WRONGTYPE ' .. what .. ' holds a ' .. found .. ', not ' .. wanted)
  end
  return found
end

-- Opens the semaphore at `hash` (with its lease zset `leases`) for a script, at server time
-- `now` (ms), for `holders`: one holder id (a single operation's) or a list of them (a grouped
-- script's; one may repeat; empty: sem_limit.lua's, for no holder); with a read-write lock's waiting writers `writers`
-- (optional: their type is checked, `marks` says whether the key exists). Sets FIELD_EXPIRY from the hash's "~expiry"; for a
-- semaphore that does not exist yet `wanted` ("fields" or anything else) decides it, if this
-- server runs HPEXPIRETIME (a cluster node not yet upgraded, or a user not granted it, gets
-- the zset: a script that failed at its first HPEXPIREAT would keep a hold without a
-- deadline). Returns a table, or nil and an error reply (nothing written):
--   limit    the recorded "~limit" (nil: none recorded)
--   expired  lease zset path: the holders whose deadline is at or before `now` (sem_purge)
--   and, for one holder, its hold: `holder`; `held`, its field (false: none); `live`, whether
--   it holds now; `entries` ("~entries:<holder id>", 1 without that field); for a list,
--   holds: per holder id, its hold (a table with the same fields). A list's entries are read
--   only when `list_entries` asks (a grouped release ends a re-entered hold entry by entry;
--   a grouped read never needs them, and reading them doubles its HMGET); without, every
--   listed hold has `entries` 1
-- A key of another type fails the call that reads it, caught here, so neither key costs a
-- TYPE when both are right. With field expiry the zset is never read: its type is checked
-- with TYPE, so a foreign key under its name is refused and never deleted (sem_settle).
-- `others`, optional (a single operation's): the other keys its script reads (its op record, a
-- fair semaphore's queue). When the HMGET finds none of the fields, one EXISTS of the hash,
-- the zset, the waiting writers and `others` asks whether any of them exists: when none does
-- (`fresh` in the state: a semaphore nobody holds or waits for, no record of the operation),
-- none of them is read, since a missing key holds no expired hold, no mark, no record and no
-- foreign type. A semaphore with holds is read as before, with no call more.
local function sem_open(hash, leases, holders, now, wanted, writers, list_entries, others)
  local got
  -- Where each holder's fields are in `got`: its hold's at 5 + stride * (k - 1), its entries'
  -- right after (stride 2), if read.
  local stride = 2
  if type(holders) == 'table' then
    local fields = {'~expiry', '~limit', '~used', '~until'}
    stride = list_entries and 2 or 1
    for _, holder in ipairs(holders) do
      fields[#fields + 1] = holder
      if list_entries then
        fields[#fields + 1] = '~entries:' .. holder
      end
    end
    got = redis.pcall('HMGET', hash, unpack(fields))
  else
    got = redis.pcall('HMGET', hash, '~expiry', '~limit', '~used', '~until', holders, '~entries:' .. holders)
  end
  if got.err then
    return sem_typed(hash, 'hash', 'semaphore key', got)
  end
  local fresh = others and not (got[1] or got[2] or got[3] or got[4] or got[5] or got[6])
    and redis.call('EXISTS', hash, leases, writers or leases, unpack(others)) == 0
  FIELD_EXPIRY = got[1] == 'fields'
  if not got[1] and wanted == 'fields' and (fresh or redis.call('EXISTS', hash) == 0) then
    local probe = redis.pcall('HPEXPIRETIME', hash, 'FIELDS', 1, '~expiry')
    FIELD_EXPIRY = type(probe) == 'table' and probe.err == nil
  end
  RECORDED_LIMIT = tonumber(got[2])
  -- The lease zset's type: checked by its read on the lease-zset path, else by TYPE.
  local expired = (FIELD_EXPIRY or fresh) and {} or redis.pcall('ZRANGEBYSCORE', leases, '-inf', int_text(now))
  if FIELD_EXPIRY and not fresh or expired.err then
    local kind, err = sem_typed(leases, 'zset', 'semaphore lease key', expired.err and expired)
    if not kind then
      return nil, err
    end
  end
  -- The fields a single holder's hold adds are made here, so that none resizes the table.
  local state = {
    limit = RECORDED_LIMIT, expired = expired, holds = false, marks = false, holder = false, held = false,
    live = false, entries = 1, fresh = fresh,
  }
  if not FIELD_EXPIRY then
    USED = tonumber(got[3]) or 0
    KEYS_UNTIL = tonumber(got[4]) or 0
    NOW = now
  end
  if writers and not fresh then
    local kind, err = sem_typed(writers, 'zset', 'waiting writers key')
    if not kind then
      return nil, err
    end
    state.marks = kind == 'zset'
  end
  -- A single holder's hold is the state itself, a listed holder's a table of its own in
  -- `state.holds`, but for the listed holders without a field: they share one hold that says
  -- so (`absent`, which nothing writes to), rather than a grouped call of fresh operations
  -- making a table per operation. A hold is live when its field is there and its deadline is
  -- after `now` (on the lease-zset path: it is not among the expired).
  local list = type(holders) == 'table' and holders
  local absent = list and {holder = false, held = false, live = false, entries = 1}
  state.holds = list and {}
  for k = 1, list and #list or 1 do
    local holder, hold = list and list[k] or holders, state
    local at = 5 + stride * (k - 1)
    local held = got[at] or false
    if list then
      hold = state.holds[holder] or (held and {} or absent)
      state.holds[holder] = hold
    end
    if hold ~= absent and hold.holder ~= holder then
      local entries = stride == 2 and tonumber(got[at + 1]) or 1
      hold.holder, hold.held, hold.entries, hold.live = holder, held, entries, held and true or false
      if hold.live and FIELD_EXPIRY then
        hold.live = (sem_deadline(hash, leases, holder) or 0) > now
      end
      for e = 1, #state.expired do
        hold.live = hold.live and state.expired[e] ~= holder
      end
    end
  end
  return state
end

-- Lease zset path: the keys' next expiry once a deadline went into the zset: when it passes
-- "~until", one lease (`deadline` - NOW) beyond it, as text, with KEYS_UNTIL set to it; nil
-- when "~until" stands. The caller writes it to "~until" (in the HSET it makes anyway, if it
-- makes one), then sets it as both keys' expiry (sem_expire_keys).
local function sem_next_until(deadline)
  if deadline <= KEYS_UNTIL then
    return nil
  end
  KEYS_UNTIL = deadline + math.max(deadline - NOW, 0)
  return int_text(KEYS_UNTIL)
end

-- Lease zset path: both keys expire at `until_text` (sem_next_until's; nil: they keep theirs).
local function sem_expire_keys(hash, leases, until_text)
  if until_text then
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
    local until_text = sem_next_until(deadline)
    if until_text then
      redis.call('HSET', hash, '~until', until_text)
    end
    sem_expire_keys(hash, leases, until_text)
  end
end

-- A hold's field value: "<permits>:<token>", then ":<label>" when `label` is given (the
-- permits as int_text(): Lua's own number text takes the floating-point path).
local function sem_hold_value(permits, token_text, label)
  return int_text(permits) .. ':' .. token_text .. (label and ':' .. label or '')
end

-- A hold's permits (a number), token (decimal text) and label (nil without one) from its
-- field value. The first two colons end the permits and the token; a label may hold colons
-- (and digits after them) of its own.
local function sem_hold_parse(value)
  local permits, token_text, rest = string.match(value, '^(%d+):(%d+)(.*)$')
  return tonumber(permits), token_text, rest ~= '' and string.sub(rest, 2) or nil
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

-- Whether leaving holds of `permits` permits in all empties the semaphore on the lease-zset
-- path ("~used" would reach 0): then it counts them gone (USED) and the caller, which settles
-- next with no write to the keys between, makes none of the drop's writes (HDEL, ZREM,
-- HINCRBY), which sem_settle's DEL of both keys would undo at once.
local function sem_empties(permits)
  if FIELD_EXPIRY or USED > permits then
    return false
  end
  USED = USED - permits
  return true
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

-- Field expiry path: the holder ids among the hash's fields (HKEYS, which leaves out a field
-- whose expiry passed).
local function sem_holders(hash)
  local holders = {}
  for _, field in ipairs(redis.call('HKEYS', hash)) do
    if string.sub(field, 1, 1) ~= '~' then
      holders[#holders + 1] = field
    end
  end
  return holders
end

-- After a change that may have ended holds: deletes a semaphore with no hold left (the keys'
-- expiry is left as it is: the header says why). With the zset "no hold left" is USED at 0;
-- with field expiry it is judged by HLEN, which may still count a field the server has not
-- reclaimed yet; such a hash goes at its own expiry.
local function sem_settle(hash, leases)
  local empty = USED <= 0
  if FIELD_EXPIRY then
    -- "~limit" and "~expiry" are the only fields of a hash without holds. HLEN also counts a
    -- field whose expiry passed but that the server has not reclaimed yet (a crashed
    -- holder's), which HKEYS leaves out: a small hash is looked through for a live hold, so
    -- the release of the last one deletes it, limit included, rather than leaving it to its
    -- own expiry. A large one (many holds) is not, to keep each change O(1) there.
    local fields = redis.call('HLEN', hash)
    if fields > 2 and fields <= SETTLE_SCAN_FIELDS then
      fields = 2 + #sem_holders(hash)
    end
    empty = fields <= 2
  end
  if empty then
    redis.call('DEL', hash, leases)
  end
end

-- The earliest deadline among the live holds (server ms), nil when none is held.
local function sem_earliest(hash, leases)
  if not FIELD_EXPIRY then
    return tonumber(redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')[2])
  end
  local holders = sem_holders(hash)
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
-- and on the waiting writers' channel `writers` of a read-write lock (nil for a semaphore);
-- with SPUBLISH when `mode` is "sharded", else PUBLISH.
local function sem_publish(hash, mode, writers)
  local command = mode == 'sharded' and 'SPUBLISH' or 'PUBLISH'
  redis.call(command, hash, 'released')
  if writers then
    redis.call(command, writers, 'released')
  end
end
