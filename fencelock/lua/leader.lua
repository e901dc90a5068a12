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
--          {1, holder, term, meta, pttl} the leader: its holder id, its term ("~token"), its
--                                       metadata ("~meta") and the ms left of its lease
--          (pttl -1: the key has no expiry, which only an operator can cause)
-- Errors   FENCELOCK_WRONGTYPE  the key holds a value this protocol did not write
local fields = redis.pcall('HGETALL', KEYS[1])
if type(fields) == 'table' and fields.err then
  if string.sub(fields.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCELOCK_WRONGTYPE lock key is not a fencelock hash')
  end
  return fields
end
if #fields == 0 then
  return {}
end
local holder, term, meta
for i = 1, #fields, 2 do
  local field = fields[i]
  if field == '~token' then
    term = fields[i + 1]
  elseif field == '~meta' then
    meta = fields[i + 1]
  elseif string.sub(field, 1, 1) ~= '~' then
    holder = field
  end
end
local pttl = redis.call('PTTL', KEYS[1])
if holder and term and meta then
  return {1, holder, tonumber(term), meta, pttl}
end
return {0, pttl}
