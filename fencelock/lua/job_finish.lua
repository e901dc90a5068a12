-- job_finish.lua: the runner of a job's tick records that the tick is done, unless a newer
-- runner has taken the job over.
--
-- KEYS[1]  the job's tick record (prefix{tag}job-tick:NAME), as job_begin.lua describes it
-- ARGV[1]  holder id        the runner's
-- ARGV[2]  token            the runner's fencing token (decimal)
-- ARGV[3]  tick             the tick the runner began (ms since the Unix epoch)
-- ARGV[4]  started          the server time its begin recorded (ms)
-- ARGV[5]  retention        ms the record is kept after this write
--
-- Returns  {1, finished}    done: the record names this runner, token and tick, with server
--                           time `finished` (the first finish's, for a re-sent one)
--          {-2, token}      the record carries a newer token: another runner took the job
--                           over (this one's hold had ended); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the record key holds a value this protocol did not write;
--                           nothing modified
--
-- Fenced by the token, not owner-checked on the lock: a runner that finishes after its hold
-- ended, with nobody having taken over, still records its tick done (it ran; a rerun would be
-- the second). A record gone meanwhile (its retention was shorter than the run) is written
-- again from the arguments, so a finished tick is never left without a record. An older
-- token in the record cannot happen while tokens increase; the newer finish wins it too.
-- Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- Uses hash_field() from lib/hash_field.lua, which the loader prepends to this file.
local recorded, recorded_err = hash_field(KEYS[1], 'token', 'tick record')
if recorded == nil then
  return recorded_err
end
local token = tonumber(ARGV[2])
if recorded and tonumber(recorded) > token then
  return {-2, tonumber(recorded)}
end
if recorded and tonumber(recorded) == token then
  local finished = redis.call('HGET', KEYS[1], 'finished')
  if finished then
    return {1, tonumber(finished)}
  end
end
local now = redis.call('TIME')
local finished = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'tick', ARGV[3], 'runner', ARGV[1], 'token', ARGV[2],
  'started', ARGV[4], 'finished', finished)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, finished}
