-- acquire_fair.lua: acquire.lua for clients in fair-handoff mode (LockClientBuilder::fair_handoff).
-- A waiting client that finds the lock held joins the lock's queue of clients; the release that
-- frees the lock (release_fair.lua) reserves it for the first queued client, and only that
-- client's attempt may claim the reservation. The default mode never runs this script.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           "~label" -> the acquisition's label (only when it was given one);
--                           or, while reserved, only "~reserved" -> the client id it is kept for
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id, as in acquire.lua: "a" once a
--                           recorded send ran (ARGV[7]), "c" when cancelled, "r:<op id>" once
--                           released; kept ARGV[3] ms
-- KEYS[4]  queue            sorted set: client id -> server time (µs) of its first failed
--                           attempt since it was last served; same slot as the lock
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
-- ARGV[4]  client id        the acquiring client's id (the part of ARGV[1] before ':')
-- ARGV[5]  "1": a waiter; on failure queue the client (ZADD NX); "0": try_acquire, no queueing
-- ARGV[6]  queue slack in ms: the queue expires this long after the lock's current lease ends
--          (every failed attempt sets it again), so entries of vanished clients cannot leak
-- ARGV[7]  "1": record this send, "0": the acquisition's only send so far (acquire.lua ARGV[4]
--          says when a record is needed and why a first send needs none)
-- ARGV[8]  label            optional, as acquire.lua ARGV[5]
--
-- Returns  {1, token, 1}    acquired: the lock was free, or reserved for this client (claimed);
--                           the hash now maps holder -> 1 with a new token, and the client's
--                           queue entry is gone
--          {1, token, n, pttl}  replay: this holder already holds the lock, pttl left of its
--                           lease (not renewed); nothing changes
--                           but the record
--          {0, pttl}        held by another holder, or reserved for another client; pttl is the
--                           remaining lease or reservation in ms (-1: no expiry, operator-made)
--          {-2}             cancelled, or a late duplicate of an acquisition whose hold ended;
--                           nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- A reservation is a hash without a holder field, so every owner-checked script (release,
-- reenter, extend, renew, cancel) answers "not held" for it, and acquire.lua (default mode)
-- sees a held lock. A claim deletes it and issues a fresh token exactly as a free lock would:
-- max(counter + 1, TIME). A free lock is taken by whoever comes (the queue orders handoffs at
-- release time only), and the winner removes its own queue entry. Every read or write that can
-- fail comes before the first write that cannot be undone. The loader prepends lib/calls.lua,
-- lib/clock.lua, lib/next_token.lua, lib/acquire.lua (lock_open, lock_grant: the same checks
-- and writes as acquire.lua) and lib/fair.lua (fair_queue) to this file.
local reply, held = lock_open(KEYS[1], KEYS[3], ARGV[1], ARGV[3], ARGV[7] == '1')
if reply then
  return reply
end
local claim = held and redis.call('HGET', KEYS[1], '~reserved') == ARGV[4]
if held and not claim then
  local pttl = redis.call('PTTL', KEYS[1])
  if ARGV[5] == '1' then
    local failed = fair_queue(KEYS[4], ARGV[4], (pttl < 0 and 1000 or pttl) + tonumber(ARGV[6]))
    if failed then
      return failed
    end
  end
  return {0, pttl}
end

local token, token_text = next_token(KEYS[2])
if not token then
  return token_text -- the error reply
end
if claim then
  redis.call('DEL', KEYS[1])
else
  -- A claim's entry was taken off the queue by the release that reserved the lock. Otherwise
  -- the winner leaves the queue; a failure here (foreign data) comes before any other write.
  local removed = redis.pcall('ZREM', KEYS[4], ARGV[4])
  if type(removed) == 'table' and removed.err then
    return refused(removed, 'queue key is not a fencelock sorted set')
  end
end
redis.call('SET', KEYS[2], token_text)
lock_grant(KEYS[1], ARGV[1], token_text, ARGV[8], ARGV[2], ARGV[7] == '1' and KEYS[3], ARGV[3])
return {1, token, 1}
