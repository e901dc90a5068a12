-- release_all.lua: release.lua for several (lock, holder) pairs in one call: a multi-lock's
-- release of its whole set.
--
-- KEYS[3i-2]  lock hash of member i (also its release channel)
-- KEYS[3i-1]  op record of member i's release (as release.lua KEYS[2])
-- KEYS[3i]    acquire record of member i's holder (as release.lua KEYS[3])
-- ARGV[1]     op record lifetime in ms
-- ARGV[2i]    holder id of member i
-- ARGV[2i+1]  op id of member i's release (the id in KEYS[3i-1])
--
-- Returns  {r1, ..., rN}   ri = n >= 0: member i released once, n entries remain (0: deleted
--                          and 'released' published on its channel); ri = -1: member i was
--                          not held by its holder, nothing changed for it
-- Errors   FENCELOCK_WRONGTYPE  a lock key holds foreign data; nothing modified (checked first)
--
-- Each member is released by release.lua's own lines, lock_release() of lib/release.lua (the
-- loader prepends it with lib/calls.lua), so its records are exactly release.lua's (a release
-- that leaves entries records its reply under its op id; the one that frees the lock marks the
-- holder's acquire record "r:<op id>"), and a release.lua re-sent later for the same op id (a
-- member guard finishing its release in the background) replays instead of decrementing
-- again, and vice versa. Freed members publish with PUBLISH.
local n = #KEYS / 3
-- Every member's read that can fail (HGET of a non-hash) comes before the first write; any
-- error other than WRONGTYPE (an ACL refusal) is returned as it is.
local counts = {}
for i = 1, n do
  counts[i] = redis.pcall('HGET', KEYS[3 * i - 2], ARGV[2 * i])
  if type(counts[i]) == 'table' and counts[i].err then
    return refused(counts[i], 'lock key is not a fencelock hash')
  end
end
local reply = {}
for i = 1, n do
  local keys = {KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]}
  reply[i] = lock_release(keys, {ARGV[2 * i], ARGV[1], 'classic', ARGV[2 * i + 1]}, nil, counts[i])
  reply[i] = reply[i][1] == 1 and reply[i][2] or -1
end
return reply
