-- lib/release.lua: the release of a plain lock, shared by release.lua, release_fair.lua,
-- handoff.lua and release_all.lua. The loader (src/protocol/scripts.rs) prepends it to each,
-- since Redis scripts cannot import. It calls no other library: release.lua runs it on every
-- release, and each function a script defines costs its every call (lib/calls.lua); so it
-- makes its WRONGTYPE refusal (refused() there) and its publish in line.
--
-- lock_release(keys, argv, free, count) is release.lua (its header is the contract) on `keys`
-- and `argv` laid out as release.lua's KEYS and ARGV: keys[1] the lock hash (and its channel),
-- keys[2] this release's op record, keys[3] the holder's acquire record; argv[1] the holder
-- id, argv[2] the op record lifetime, argv[3] the pub/sub mode, argv[4] the op id. It answers
-- a replay from the op record, {-1} to a non-holder, and takes one entry of a lock entered
-- more than once. The release that frees the lock frees it with `free()` (nil: DEL): `free`
-- makes its own checks first and answers an error reply when one fails, before any write; it
-- deletes or reserves the hash and answers nil, or hands the lock on and answers that reply.
-- Then the holder's acquire record gets the mark "r:<op id>" (no record of its own: one
-- record per hold), "released" is published unless the lock was handed on, and the answer is
-- {1, 0}. A re-sent copy of that release finds the mark and no holder, and answers {1, 0} and
-- true (a replay of the mark: handoff.lua answers the grant it made, if it still holds).
-- `count`, optional: the holder's field as the caller read it (false: absent), so that it is
-- not read again. `first`, optional: true when the op record need not be read (release.lua's
-- ARGV[5], whose header says when). Errors: FENCELOCK_WRONGTYPE when the lock key is not a hash, nothing written.
local function lock_release(keys, argv, free, count, first)
  local done = not first and redis.call('GET', keys[2])
  if done then
    return {1, tonumber(done)}
  end
  -- One read is the type check and the owner check: HGET of a non-hash fails (WRONGTYPE).
  if count == nil then
    count = redis.pcall('HGET', keys[1], argv[1])
    if type(count) == 'table' and count.err then
      return string.sub(count.err, 1, 9) ~= 'WRONGTYPE' and count
        or redis.error_reply('FENCELOCK_WRONGTYPE lock key is not a fencelock hash')
    end
  end
  if not count then
    if redis.call('GET', keys[3]) == 'r:' .. argv[4] then
      return {1, 0}, true
    end
    return {-1}
  end

  local remaining = tonumber(count) - 1
  if remaining > 0 then
    redis.call('HINCRBY', keys[1], argv[1], '-1')
    redis.call('SET', keys[2], string.format('%d', remaining), 'PX', argv[2])
    return {1, remaining}
  end
  local handed = free and free()
  if handed and handed.err then
    return handed
  end
  if not free then
    redis.call('DEL', keys[1])
  end
  redis.call('SET', keys[3], 'r:' .. argv[4], 'PX', argv[2])
  if handed then
    return handed
  end
  redis.call(argv[3] == 'sharded' and 'SPUBLISH' or 'PUBLISH', keys[1], 'released')
  return {1, 0}
end
