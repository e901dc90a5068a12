-- job_begin.lua: the instance that has just won a job's lock records that it runs the job for
-- its tick, unless that tick is done, was abandoned by a runner that died, or is already past.
--
-- KEYS[1]  the job's lock hash (prefix{tag}job:NAME): fields as a lock's, <holder id> ->
--          re-entry count and "~token" -> the holder's fencing token
-- KEYS[2]  the job's tick record (prefix{tag}job-tick:NAME), a hash describing the newest
--          tick begun: "tick" -> that tick as its first runner saw it (ms since the Unix
--          epoch), "runner" -> the holder id that runs or ran it, "token" -> that runner's
--          fencing token, "started" -> server time of the begin (ms), "finished" -> server time
--          of the finish (ms; absent while the tick runs), "failed" -> server time the run
--          ended in a failure that leaves the tick to a retry (ms; job_finish.lua). Expires
--          ARGV[5] ms after each write.
-- ARGV[1]  holder id        the caller's: the id its lock acquisition was made with
-- ARGV[2]  token            the token that acquisition was issued (decimal)
-- ARGV[3]  tick             the caller's view of the tick (ms since the Unix epoch)
-- ARGV[4]  period           ms; two views less than half a period apart are the same tick
-- ARGV[5]  retention        ms the record is kept after this write
-- ARGV[6]  policy for a tick whose runner's hold ended before it finished: "run-again" takes
--          the tick over; anything else gives it up
--
-- Returns  {1, 0, started}  begun: the record now names the caller, with ARGV[3] as the tick
--                           and server time `started`
--          {1, old, started} begun by taking over the same tick from the runner with token
--                           `old`, whose hold ended before it finished ("run-again"), or
--                           whose run failed (whatever the policy)
--          {1, old or 0, started}  also for a re-sent begin (the record already names this
--                           token): as its first send answered, a takeover's included
--          {2, tick, runner, token, started, finished, 0}  the same tick is done; nothing
--                           changed
--          {3, tick, runner, token, started, 0, 0}  the same tick's runner's hold ended before
--                           it finished and the policy gives the tick up; nothing changed
--          {4, tick, runner, token, started, finished or 0, failed or 0}  a newer tick has
--                           begun: this one is past; nothing changed
--          {-1}             ARGV[1] does not hold the lock with token ARGV[2]; nothing changed,
--                           but a record of its own run, never finished, becomes failed (a
--                           begin re-sent after its hold ended: its caller runs nothing)
--          {-2, tick, runner, token, started, finished or 0, failed or 0}  the record carries
--                           a newer token
--                           than the caller's (the fence counter went back); nothing changed
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing
--                           modified
--
-- Owner-checked by holder id and token, so only the job's current lock holder begins a tick,
-- and at most one tick at a time. The record is the newest tick begun: a tick older than it
-- by half a period or more is never begun again, which is what keeps a tick run at most once
-- (its done record is replaced only by a newer tick's). The same tick is recognised by
-- distance, not by rounding to a grid, so instance clocks that differ by less than half a
-- period agree whatever the schedule's phase. A runner whose record still says running while
-- the caller holds the lock has lost its hold (its lease `at_most_for` ran out, or it let go
-- without finishing): the policy decides. A run that failed and left its tick to a retry
-- (`failed`) is taken over whatever that policy: it did not run the job to the end, and said
-- so. Commands: HGET, HSET, DEL, PEXPIRE, TIME.
--
-- Uses run_begin() (lib/run_record.lua) and tick_record() (lib/tick_record.lua), which the
-- loader prepends to this file after lib/calls.lua and lib/clock.lua.

return run_begin({
  lock = KEYS[1], key = KEYS[2], holder = ARGV[1], token = ARGV[2],
  field = 'tick', value = ARGV[3], retention = ARGV[5], policy = ARGV[6],
  what = 'tick record', record = tick_record,
  -- A record of another tick: a newer one makes this tick past; an older one is replaced.
  after = function(recorded)
    -- Twice the distance against the period keeps the comparison in integers.
    local distance = 2 * (tonumber(ARGV[3]) - tonumber(redis.call('HGET', KEYS[2], 'tick')))
    local period = tonumber(ARGV[4])
    if distance >= period then
      return 'new'
    end
    if distance <= -period then
      return tick_record(KEYS[2], 4, recorded)
    end
  end,
})
