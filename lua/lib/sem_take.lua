-- lib/sem_take.lua: taking a hold of a semaphore or read-write lock, shared by sem_acquire.lua,
-- sem_handoff.lua (its grant), rw_acquire.lua and rw_read_many.lua; the loader
-- (src/protocol/scripts.rs) prepends it to each, after lib/sem_holds.lua (whose functions and
-- state it uses) and lib/next_token.lua (sem_token), since Redis scripts cannot import. Each
-- read of rw_read_many.lua is answered by the same sem_again() as rw_acquire.lua's.

-- An acquisition's answer before anything is granted (sem_acquire.lua, rw_acquire.lua and
-- each read of rw_read_many.lua). A live `hold` of its holder is the same request again, whose
-- reply was lost: {1, token}, and the hold's permits second; a recorded send (`recorded`
-- true) leaves "a" in its op record `record` for `ttl` ms, NX. Without a live hold, an op
-- record (`done`: the acquisition ran and its hold ended since, or it was cancelled) answers
-- {-2}. Else nil: a fresh acquisition.
local function sem_again(hold, done, record, ttl, recorded)
  if hold.live then
    if recorded then
      redis.call('SET', record, 'a', 'PX', ttl, 'NX')
    end
    local permits, token_text = sem_hold_parse(hold.held)
    return {1, tonumber(token_text)}, permits
  end
  if done then
    return {-2}
  end
end

-- The token of a new hold, as a number and as its text, or nil and an error reply, before the
-- script's first write, so an error leaves nothing done. When `granted` (the semaphore is free:
-- the hold will be granted whatever follows), the counter is read and written in one call
-- (take_token()); else it is only read (next_token()), and the caller writes the text with the
-- grant.
local function sem_token(fence_key, clock, granted)
  if not granted then
    return next_token(fence_key, clock)
  end
  local text, err = take_token(fence_key, clock)
  return text and tonumber(text), text or err
end

-- A new hold of `permits` with its token and `label` (nil: none) and the semaphore's `limit`
-- (recorded), until `deadline`; the keys expire no earlier than it. On the lease-zset path
-- the hold, "~used", a changed "~limit" and a moved "~until" go in one HSET.
local function sem_grant(hash, leases, holder, permits, token_text, label, limit, deadline)
  local value = sem_hold_value(permits, token_text, label)
  if FIELD_EXPIRY then
    redis.call('HSET', hash, holder, value, '~limit', int_text(limit), '~expiry', 'fields')
    sem_set_deadline(hash, leases, holder, deadline)
    return
  end
  USED = USED + permits
  local fields = {holder, value, '~used', int_text(USED)}
  if RECORDED_LIMIT ~= limit then
    fields[5], fields[6] = '~limit', int_text(limit)
    RECORDED_LIMIT = limit
  end
  local until_text = sem_next_until(deadline)
  if until_text then
    fields[#fields + 1], fields[#fields + 2] = '~until', until_text
  end
  redis.call('HSET', hash, unpack(fields))
  redis.call('ZADD', leases, int_text(deadline), holder)
  sem_expire_keys(hash, leases, until_text)
end

