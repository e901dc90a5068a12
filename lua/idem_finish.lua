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
-- Uses run_finish() (lib/run_record.lua), which the loader prepends to this file after
-- lib/calls.lua and lib/clock.lua.
return run_finish({
  key = KEYS[1], holder = ARGV[1], token = ARGV[2], started = ARGV[4], retention = ARGV[5],
  field = 'fingerprint', value = ARGV[3], what = 'idempotency record',
  outcome = ARGV[6], ends = {done = 'finished', final = 'finished', failed = 'failed'},
  -- A stored result goes with "finished".
  also = {'result', ARGV[7], 'final', ARGV[6] == 'final' and '1' or '0'},
})
