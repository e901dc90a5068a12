-- hold_reenter.lua: the holder of a read-write lock's hold enters it once more through its
-- guard (a nested read, or a nested write), with the same token and lease.
--
-- KEYS[1]  lock hash        (layout in lib/sem_holds.lua)
-- KEYS[2]  lease zset
-- KEYS[3]  op record        string: this operation's reply ("token:entries"), kept ARGV[2] ms
--                           so a re-sent request replays it instead of counting twice; "c" when
--                           cancelled (sem_cancel.lua)
-- ARGV[1]  holder id
-- ARGV[2]  op record lifetime in ms
--
-- Returns  {1, token, n}    entered: the hold now has n entries (its "~entries:<holder>" field);
--                           token is the hold's own, never a new one
--          {-1}             the holder holds nothing here (its lease ended, it was released)
--          {-2}             this operation was cancelled before it ran; nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--
-- A hold whose lease passed is not entered again, even before any script dropped it. The loader
-- prepends lib/clock.lua and lib/sem_holds.lua to this file.
local done = redis.call('GET', KEYS[3])
if done == 'c' then
  return {-2}
elseif done then
  local token, entries = string.match(done, '^(%d+):(%d+)$')
  return {1, tonumber(token), tonumber(entries)}
end
local sem, err = sem_open(KEYS[1], KEYS[2], ARGV[1], now_ms(), nil)
if not sem then
  return err
end
if not sem.live then
  return {-1}
end
local _, token = sem_hold_parse(sem.held)
local entries = sem.entries + 1
sem_set_entries(KEYS[1], KEYS[2], ARGV[1], entries)
redis.call('SET', KEYS[3], token .. ':' .. entries, 'PX', ARGV[2])
return {1, tonumber(token), entries}
