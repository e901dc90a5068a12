-- leader.lua: who leads an election now, read in one step so that the id, the term and the
-- metadata come from the same hash. Read-only.
--
-- KEYS[1]  lock hash of the election (prefix{tag}leader:NAME)
--
-- Returns  {}                           nobody holds the election's lock
--          {0, pttl}                    the lock is held but nobody leads yet: the winner has
--                                       not recorded its metadata (announce.lua, one round trip
--                                       after its acquisition; a winner that died in between
--                                       blocks the election until pttl ends), or it is a
--                                       fair-handoff reservation
--          {1, holder, term, meta, pttl} the leader: its holder id ("~leader", present as a
--                                       holder field), its term ("~token"), its metadata
--                                       ("~meta") and the ms left of its lease
--          (pttl -1: the key has no expiry, which only an operator can cause)
-- Errors   FENCELOCK_WRONGTYPE  the key holds a value this protocol did not write
--
-- Only HGET, HEXISTS and PTTL: the commands of the least-privilege ACL (README, Security). The
-- loader prepends lib/calls.lua (refused: the first HGET is the type check) to this file.
local term = redis.pcall('HGET', KEYS[1], '~token')
if type(term) == 'table' and term.err then
  return refused(term, 'lock key is not a fencelock hash')
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return {}
end
local leader = redis.call('HGET', KEYS[1], '~leader')
local meta = redis.call('HGET', KEYS[1], '~meta')
if term and leader and meta and redis.call('HEXISTS', KEYS[1], leader) == 1 then
  return {1, leader, tonumber(term), meta, pttl}
end
return {0, pttl}
