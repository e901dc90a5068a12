-- wait_record.lua: records, for operators, that an acquisition is waiting for a lock, a
-- semaphore or a read-write lock, and which locks the task that waits holds (`fencelock waits`
-- and the possible-deadlock report read it). Sent on the contended path only, by the head of a
-- client's local queue for the key once its wait has lasted a second, and again when a busy
-- attempt finds the record could expire before the next one; never on the uncontended path. The
-- record expires by itself when its waiter stops refreshing it (gone, or no longer waiting);
-- a waiter that stops waiting also deletes it.
--
-- KEYS[1]  wait record      hash prefix{tag}wait:<waiting holder id>, in the awaited key's slot:
--                           "waits_for" -> the awaited key, "label" -> the acquisition's label
--                           ("" without), "since" -> server time (ms) the wait began (set by
--                           its first record, kept by every refresh), "holds" -> n, "hold:1".."hold:n" ->
--                           the keys of the locks and holds the waiting task holds
-- ARGV[1]  lifetime in ms   positive integer: longer than the time to the waiter's next attempt
-- ARGV[2]  waited in ms     how long the wait has lasted; a first record's "since" is the
--                           server time minus this (a wait is recorded only once it lasted)
-- ARGV[3]  the awaited key  (the lock hash, the semaphore's or read-write lock's hash)
-- ARGV[4]  label            "" when the acquisition has none
-- ARGV[5..] held keys       the keys the waiting task holds (none: it holds nothing)
--
-- Returns  1                recorded (or refreshed)
-- Errors   FENCELOCK_WRONGTYPE  KEYS[1] holds a value this protocol did not write; nothing modified
--
-- Commands: HGET, TIME, DEL, HSET, PEXPIRE. The record is advice: a waiter ignores a failed
-- call, and nothing a lock guarantees reads it. The loader prepends lib/clock.lua to this file.
local since = redis.pcall('HGET', KEYS[1], 'since')
if type(since) == 'table' and since.err then
  return redis.error_reply('FENCELOCK_WRONGTYPE wait record holds foreign data')
end
if not since then
  since = int_text(now_ms() - (tonumber(ARGV[2]) or 0))
end
redis.call('DEL', KEYS[1])
local fields = {'waits_for', ARGV[3], 'label', ARGV[4], 'since', since, 'holds', #ARGV - 4}
for i = 5, #ARGV do
  fields[#fields + 1] = 'hold:' .. (i - 4)
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
