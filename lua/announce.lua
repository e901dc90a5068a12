-- announce.lua: a candidate that has just won an election's lock records its metadata next to
-- its term and tells the followers. Only elections run it; plain locks never carry "~meta".
--
-- KEYS[1]  lock hash of the election (prefix{tag}leader:NAME; also its channel)
--                           fields: <holder id> -> re-entry count, "~token" -> the term,
--                           "~leader" -> the leader's holder id and "~meta" -> its metadata
--                           (both written here)
-- ARGV[1]  holder id        the leader's: the id its acquisition was made with
-- ARGV[2]  term             the token that acquisition was issued (decimal)
-- ARGV[3]  metadata         bytes, at most 4 KiB (the client refuses more before sending)
-- ARGV[4]  pub/sub mode: "sharded" publishes with SPUBLISH (Redis Cluster: the channel is the
--          lock key, so it is in this script's slot); anything else: PUBLISH
--
-- Returns  {1}              recorded: "~leader" = ARGV[1] and "~meta" = ARGV[3] in the same hash
--                           as the holder and its term, and "elected" was published on KEYS[1]
--          {-1}             ARGV[1] does not hold the lock with term ARGV[2] (its lease ran
--                           out, the key was deleted, another leader took over); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the lock key holds a value this protocol did not write;
--                           nothing modified
--
-- Owner-checked by holder id and term, so a late or re-sent copy can never put one leader's
-- metadata next to another leader's term. Idempotent: a re-send writes the same bytes again
-- (and publishes again, which only makes followers read once more). The fields live and die
-- with the hash: renewed with the lease, deleted by the release, the expiry, a cancel or a
-- forced release; every other script ignores them (they look up the holder id, "~token" or
-- "~reserved" by name). "~leader" repeats the holder id so that leader.lua reads the leader
-- with HGET alone (the least-privilege ACL has no HGETALL or HKEYS). The loader prepends
-- lib/calls.lua (refused: the HGET is the type check; publish) to this file.
local held = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(held) == 'table' and held.err then
  return refused(held, 'lock key is not a fencelock hash')
end
if not held or redis.call('HGET', KEYS[1], '~token') ~= ARGV[2] then
  return {-1}
end
redis.call('HSET', KEYS[1], '~leader', ARGV[1], '~meta', ARGV[3])
publish(ARGV[4], KEYS[1], 'elected')
return {1}
