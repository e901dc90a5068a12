-- idem_begin.lua: the caller that has just won an idempotency key's lock records that it runs
-- the key's request, unless the key is done, was used for another request, or was abandoned
-- by a runner that died and the policy gives it up.
--
-- KEYS[1]  the key's lock hash (prefix{tag}idem:NAME): fields as a lock's, <holder id> ->
--          re-entry count and "~token" -> the holder's fencing token
-- KEYS[2]  the key's record (prefix{tag}idem-rec:NAME), a hash describing the newest run:
--          "fingerprint" -> the request's fingerprint as its first runner gave it, "runner" ->
--          the holder id that runs or ran it, "token" -> that runner's fencing token,
--          "started" -> server time of the begin (ms), "finished" -> server time the result
--          was stored (ms; absent until then), "result" -> the stored result (bytes; with
--          "finished"), "final" -> "1" when that result is a failure the caller made final,
--          "failed" -> server time the run failed and left the key to a retry (ms;
--          idem_finish.lua). Expires ARGV[4] ms after each write.
-- ARGV[1]  holder id        the caller's: the id its lock acquisition was made with
-- ARGV[2]  token            the token that acquisition was issued (decimal)
-- ARGV[3]  fingerprint      what the caller's request is (bytes; the caller's digest of it)
-- ARGV[4]  retention        ms the record is kept after this write
-- ARGV[5]  policy for a run whose runner's hold ended before it finished: "run-again" takes
--          the key over; anything else gives it up
--
-- Returns  {1, 0, started}  begun: the record now names the caller and its fingerprint, with
--                           server time `started`; a re-sent begin (the record already names
--                           this token) answers as its first send did, a takeover's included
--          {1, old, started} begun by taking over from the runner with token `old`, whose
--                           hold ended before it finished ("run-again"), or whose run failed
--                           (whatever the policy)
--          {2, RECORD}       the key is done: its result is stored; nothing changed
--          {3, RECORD}       the runner's hold ended before it finished and the policy gives
--                           the key up; nothing changed
--          {-1}              ARGV[1] does not hold the lock with token ARGV[2]; nothing changed,
--                            but a record of its own run, never finished, becomes failed (a
--                            begin re-sent after its hold ended: its caller runs nothing)
--          {-2, RECORD}      the record carries a newer token than the caller's (the fence
--                           counter went back); nothing changed
--          {-3, RECORD}      the key was used with another fingerprint; nothing changed
--          RECORD is: runner, token, started, finished or 0, failed or 0, final (0 or 1),
--          result ("" unless finished), fingerprint
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing
--                           modified
--
-- Owner-checked by holder id and token, so only the key's current lock holder begins a run,
-- and at most one run at a time. A record that names a runner without "finished" or
-- "failed" while the caller holds the lock is a run whose runner lost its hold (its lease
-- `at_most_for` ran out, or it was dropped mid-run): the policy decides. A failed run left
-- the key to a retry and is taken over whatever the policy. The fingerprint is checked
-- before anything else: a key reused for another request never runs it, whatever state the
-- first request is in. Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- Uses run_begin() (lib/run_record.lua) and idem_record() (lib/idem_record.lua), which the
-- loader prepends to this file after lib/calls.lua and lib/clock.lua.
return run_begin({
  lock = KEYS[1], key = KEYS[2], holder = ARGV[1], token = ARGV[2],
  field = 'fingerprint', value = ARGV[3], retention = ARGV[4], policy = ARGV[5],
  what = 'idempotency record', record = idem_record,
  -- Another request's record: refused before anything else.
  before = function(recorded)
    if redis.call('HGET', KEYS[2], 'fingerprint') ~= ARGV[3] then
      return idem_record(KEYS[2], -3, recorded)
    end
  end,
})
