-- job_finish.lua: the runner of a job's tick records that the tick is done (or that its run
-- failed and leaves the tick to a retry), unless a newer runner has taken the job over.
--
-- KEYS[1]  the job's tick record (prefix{tag}job-tick:NAME), as job_begin.lua describes it
-- ARGV[1]  holder id        the runner's
-- ARGV[2]  token            the runner's fencing token (decimal)
-- ARGV[3]  tick             the tick the runner began (ms since the Unix epoch)
-- ARGV[4]  started          the server time its begin recorded (ms)
-- ARGV[5]  retention        ms the record is kept after this write
-- ARGV[6]  outcome          "done": the tick ran; "failed": the run failed and leaves the tick
--                           to a retry (job_begin.lua takes it over for the next caller)
--
-- Returns  {1, at}          recorded: the record names this runner, token and tick, with
--                           server time `at` as "finished" (done) or "failed" (the first
--                           call's, for a re-sent one)
--          {-2, token}      the record carries a newer token: another runner took the job
--                           over (this one's hold had ended); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  the record key holds a value this protocol did not write;
--                           nothing modified
--          FENCELOCK_BADARG     an outcome other than "done" or "failed"; nothing modified
--
-- Fenced by the token, not owner-checked on the lock: a runner that finishes after its hold
-- ended, with nobody having taken over, still records its tick done (it ran; a rerun would be
-- the second). A record gone meanwhile (its retention was shorter than the run) is written
-- again from the arguments, so a finished tick is never left without a record. An older
-- token in the record cannot happen while tokens increase; the newer finish wins it too.
-- Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- Uses run_finish() (lib/run_record.lua), which the loader prepends to this file after
-- lib/calls.lua and lib/clock.lua.
return run_finish({
  key = KEYS[1], holder = ARGV[1], token = ARGV[2], started = ARGV[4], retention = ARGV[5],
  field = 'tick', value = ARGV[3], what = 'tick record',
  outcome = ARGV[6], ends = {done = 'finished', failed = 'failed'},
})
