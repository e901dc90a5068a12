-- lib/sem_give.lua: leaving a hold of a semaphore or read-write lock, shared by sem_release.lua,
-- sem_handoff.lua and sem_release_many.lua; the loader (src/protocol/scripts.rs) prepends it to
-- each, after lib/sem_holds.lua (whose functions and state it uses), since Redis scripts cannot
-- import. Each release of sem_release_many.lua is answered by the same sem_leave() as
-- sem_release.lua's.

-- One release of `hold` (of `state`, as sem_open read it; for a single holder, `state` itself) whose op record `record` reads
-- `done` (sem_release.lua, sem_handoff.lua, each release of sem_release_many.lua): replays a
-- release that left entries, or takes one entry of a hold entered more than once (the record
-- keeps the entries left, `ttl` ms), and returns that reply. Drops expired holds first, so a
-- holder whose lease ended holds nothing. Returns nil when the release ends the hold, or
-- finds no live hold (`hold.live` says which): the caller drops it (sem_drop).
local function sem_leave(hash, leases, state, hold, done, record, ttl)
  if done then
    return {1, tonumber(done)}
  end
  sem_purge(hash, leases, state)
  if hold.live and hold.entries > 1 then
    hold.entries = hold.entries - 1
    sem_set_entries(hash, leases, hold.holder, hold.entries)
    redis.call('SET', record, int_text(hold.entries), 'PX', ttl)
    return {1, hold.entries}
  end
end

-- sem_release.lua (its header is the contract) on `keys` and `argv` laid out as its KEYS and
-- ARGV, with the read-write lock's waiting writers `writers` (nil for a semaphore); also the
-- release of sem_handoff.lua, which passes `hand_on` and `replayed`. A release that ends the
-- hold calls hand_on(state, clock, now) (`state` as sem_open read it, `clock` this script's
-- TIME, `now` in ms) after dropping the hold: it makes its own reads first, then grants the
-- permits on and answers that reply, or answers nil; the holder's acquire record then gets the
-- mark "r:<op id>", and unless the permits were handed on the keys are settled, waiters told
-- (sem_publish; a read-write lock's release that leaves holds, on the lease-zset path, tells
-- nobody: its waiting writers wait for no hold at all, its waiting readers for a writer's hold
-- or mark, which a reader's release does not end) and the answer is {1, 0}. A re-sent copy of
-- that release finds the mark and no hold, and answers what replayed(state) answers, or {1, 0}.
-- `first` (sem_release.lua ARGV[5] "0"): the release's op record is not read, as release.lua's.
local function sem_release_hold(keys, argv, writers, hand_on, replayed, first)
  local clock = redis.call('TIME')
  local now = now_ms(clock)
  local sem, err = sem_open(keys[1], keys[2], argv[1], now, nil)
  if not sem then
    return err
  end
  local left = sem_leave(keys[1], keys[2], sem, sem, not first and redis.call('GET', keys[3]), keys[3], argv[2])
  if left then
    return left
  end
  -- The last hold, with nothing to hand on: sem_settle below deletes the keys (sem_empties).
  -- Else the hold's field, read once by sem_open, is what sem_drop would read (none: false).
  local last = sem.live and not hand_on and sem_empties(sem_hold_parse(sem.held))
  if not last and sem_drop(keys[1], keys[2], argv[1], sem.live and sem.held) == 0 then
    sem_settle(keys[1], keys[2])
    if redis.call('GET', keys[4]) == 'r:' .. argv[4] then
      return replayed and replayed(sem) or {1, 0}
    end
    return {-1}
  end
  local handed = hand_on and hand_on(sem, clock, now)
  redis.call('SET', keys[4], 'r:' .. argv[4], 'PX', argv[2])
  if handed then
    return handed
  end
  sem_settle(keys[1], keys[2])
  if not (writers and not FIELD_EXPIRY and USED > 0) then
    sem_publish(keys[1], argv[3], writers)
  end
  return {1, 0}
end
