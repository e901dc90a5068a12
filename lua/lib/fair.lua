-- lib/fair.lua: the queue of fair-handoff mode (section 7.1 of DESIGN.md), shared by
-- acquire_fair.lua, release_fair.lua and leave_fair.lua. The loader (src/protocol/scripts.rs)
-- prepends it to each, after lib/calls.lua and lib/clock.lua (whose refused(), micros() and
-- int_text() it uses), since Redis scripts cannot import.
--
-- A lock's queue is a sorted set in the lock's slot: client id -> server time (µs) of the
-- client's first failed attempt since it was last served. A reservation is the lock hash with
-- the single field "~reserved" -> the client id it is kept for, expiring after the grace.
--
-- fair_queue(queue, client, lifetime) queues `client` at the back unless it is queued already
-- (ZADD NX, scored with the server time), and sets the queue to expire `lifetime` ms from now,
-- so that entries of vanished clients cannot leak. Returns nil; or an error reply when the
-- queue key holds another type (nothing written).
--
-- fair_pass_on(lock, queue, grace) frees the lock for the first queued client: takes it off
-- the queue (ZPOPMIN) and replaces the lock hash by a reservation for it of `grace` ms; an
-- empty queue leaves the lock free (deleted). Returns ZPOPMIN's reply ({client, score}, or
-- {} for an empty queue); or nil and an error reply when the queue holds another type,
-- nothing written (the pop is the first write).
local function fair_queue(queue, client, lifetime)
  local added = redis.pcall('ZADD', queue, 'NX', int_text(micros()), client)
  if type(added) == 'table' and added.err then
    return refused(added, 'queue key is not a fencelock sorted set')
  end
  redis.call('PEXPIRE', queue, lifetime)
end

local function fair_pass_on(lock, queue, grace)
  local first = redis.pcall('ZPOPMIN', queue)
  if first.err then
    return nil, refused(first, 'queue key is not a fencelock sorted set')
  end
  redis.call('DEL', lock)
  if first[1] then
    redis.call('HSET', lock, '~reserved', first[1])
    redis.call('PEXPIRE', lock, grace)
  end
  return first
end
