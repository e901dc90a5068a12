-- fenced_read.lua: read a resource as the holder of `token`. A claiming read (the default)
-- claims it for that token, so that from now on no older token can write to it; a shared read,
-- for holders that share a hold (the readers of a read-write lock), fences every older writer
-- the same way but never refuses another reader.
--
-- KEYS[1]  resource data
-- KEYS[2]  high-water mark  the exclusive mark (lib/fence_mark.lua)
-- KEYS[3]  shared mark      the highest token of a shared read
-- ARGV[1]  token            positive integer below 2^53
-- ARGV[2]  kind             "get" | "hget" | "lrange" | "claim"
-- ARGV[3]  field            for hget ("" otherwise)
-- ARGV[4]  mode             "claim" | "shared"
-- ARGV[5]  retention        ms the resource's keys are kept after this read; "0": no expiry
--
-- Returns  {1, value}       claim: token >= both marks; the exclusive mark is now
--                           max(mark, token). shared: token >= the exclusive mark; the shared
--                           mark is now max(shared, token). With a retention, data and marks
--                           now expire ARGV[5] ms from now. value is the string (get), the
--                           field (hget), the list (lrange), or 0 (claim); a missing key or
--                           field reads as false (nil)
--          {0, latest, by}  refused, nothing read: claim: token below a mark (latest: the
--                           higher); shared: token below the exclusive mark (latest: it), that
--                           is, a holder with a newer token has written or claimed since this
--                           reader's hold began, so what it would read is not its view. by: 1
--                           when latest is the shared mark (a newer reader read), else 0; or,
--                           with a retention and no mark left, 2 and latest the oldest token
--                           accepted: this one was issued at or before server time minus the
--                           retention (lib/fence_mark.lua)
--
-- Errors   FENCELOCK_WRONGTYPE  a key holds a type this read cannot apply to; nothing modified
--          FENCELOCK_BADARG     the token, kind, mode or retention is not valid
--
-- Why reads claim: fencing rejects a stale write only once the storage has seen the newer
-- token. If the new holder read without its token, a paused old holder waking between that
-- read and the new holder's write could still write (its token is not older than any the
-- resource has seen), and the new holder's write, computed from the earlier read, would then
-- overwrite it: a lost update. Claiming on read closes that gap. Why shared reads do not raise
-- the exclusive mark: readers of one hold get different tokens (r1 < r2), and a claim by r2
-- would refuse r1's next read although nothing was written. No op record for either: raising
-- a mark to the same token again changes nothing.
--
-- Uses fence_mark(), data_check() and keep_for() from lib/fence_mark.lua, which the loader
-- prepends to this file.
-- A shared read is refused only by a newer exclusive token; a claim by either mark.
local token, exclusive, shared = fence_mark(ARGV[1], KEYS[2], KEYS[3], ARGV[4], ARGV[5])
if not token then
  return exclusive
end
local sharing = ARGV[4] == 'shared'

-- Per kind: the type the data must have (or none), then the read.
local kind = ARGV[2]
local value = 0
if kind ~= 'claim' then
  local wanted = kind == 'get' and 'string' or kind == 'hget' and 'hash' or kind == 'lrange' and 'list'
  if not wanted then
    return redis.error_reply('FENCELOCK_BADARG unknown read kind ' .. tostring(kind))
  end
  local refused = data_check(KEYS[1], wanted)
  if refused then
    return refused
  end
  if kind == 'get' then
    value = redis.call('GET', KEYS[1])
  elseif kind == 'hget' then
    value = redis.call('HGET', KEYS[1], ARGV[3])
  else
    value = redis.call('LRANGE', KEYS[1], 0, -1)
  end
end

if sharing then
  if token > shared then
    redis.call('SET', KEYS[3], ARGV[1])
  end
elseif token > exclusive then
  redis.call('SET', KEYS[2], ARGV[1])
end
keep_for(ARGV[5], KEYS[1], KEYS[2], KEYS[3])
return {1, value}
