-- idem_finish.lua: the runner of an idempotency key's request stores its result (or records
-- that its run failed and leaves the key to a retry), unless a newer runner has taken the key
-- over.
--
-- KEYS[1]  the key's record (prefix{tag}idem-rec:NAME), as idem_begin.lua describes it
-- ARGV[1]  holder id        the runner's
-- ARGV[2]  token            the runner's fencing token (decimal)
-- ARGV[3]  fingerprint      the request's, as its begin gave it
-- ARGV[4]  started          the server time its begin recorded (ms)
-- ARGV[5]  retention        ms the record is kept after this write
-- ARGV[6]  outcome          "done": store ARGV[7] as the result; "final": store ARGV[7] as a
--                           result that is a failure; "failed": the run failed and leaves the
--                           key to a retry (idem_begin.lua takes it over for the next caller)
-- ARGV[7]  result           bytes; ignored for "failed"
--
-- Returns  {1, at}          recorded: the record names this runner and token, with server
--                           time `at` as "finished" (done, final) or "failed" (the first
--                           call's, for a re-sent one)
--          {-2, token}      the record carries a newer token: another runner took the key
--                           over (this one's hold had ended); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the record key holds a value this protocol did not write;
--                           nothing modified
--          FENCELOCK_BADARG     an outcome other than "done", "final" or "failed"; nothing
--                           modified
--
-- Fenced by the token, not owner-checked on the lock: a runner that finishes after its hold
-- ended, with nobody having taken over, still stores its result (it ran; a rerun would be
-- the second). A record gone meanwhile (its retention was shorter than the run) is written
-- again from the arguments, so a finished run is never left without its result. An older
-- token in the record cannot happen while tokens increase; the newer finish wins it too.
-- Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- Uses hash_field() from lib/hash_field.lua, which the loader prepends to this file.
local field = ({done = 'finished', final = 'finished', failed = 'failed'})[ARGV[6]]
if not field then
  return redis.error_reply('FENCELOCK_BADARG unknown run outcome ' .. tostring(ARGV[6]))
end
local recorded, recorded_err = hash_field(KEYS[1], 'token', 'idempotency record')
if recorded == nil then
  return recorded_err
end
local token = tonumber(ARGV[2])
if recorded and tonumber(recorded) > token then
  return {-2, tonumber(recorded)}
end
if recorded and tonumber(recorded) == token then
  local at = redis.call('HGET', KEYS[1], field)
  if at then
    return {1, tonumber(at)}
  end
end
local now = redis.call('TIME')
local at = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[3], 'runner', ARGV[1], 'token', ARGV[2],
  'started', ARGV[4], field, at)
if field == 'finished' then
  redis.call('HSET', KEYS[1], 'result', ARGV[7], 'final', ARGV[6] == 'final' and '1' or '0')
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, at}
