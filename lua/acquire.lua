-- acquire.lua: take a free lock for a new holder and issue its fencing token.
--
-- KEYS[1]  lock hash        fields: <holder id> -> re-entry count, "~token" -> fencing token,
--                           "~label" -> the acquisition's label (only when it was given one)
-- KEYS[2]  fence counter    string: highest token issued in this slot (shared by every lock in it)
-- KEYS[3]  op record        string, keyed by the holder id: "a" once a recorded send of this
--                           acquisition ran (ARGV[4]), "c" when it was cancelled (see cancel.lua),
--                           "r:<op id>" once its hold was released (release.lua); kept ARGV[3] ms
-- ARGV[1]  holder id        unique per acquisition, never reused
-- ARGV[2]  lease in ms      positive integer
-- ARGV[3]  op record lifetime in ms
-- ARGV[4]  "1": record this send: an earlier send of the acquisition may still arrive (its
--          outcome was unknown), so an acquisition or replay here leaves "a" in KEYS[3] for that
--          copy to find; "0": the acquisition's only send so far, nothing recorded (below)
-- ARGV[5]  label            optional: an operator's tag for the hold (a request or trace id),
--                           kept in the hash while the hold lasts; absent: no "~label" field
--
-- Returns  {1, token, 1}    acquired: the hash now maps holder -> 1 and expires after the lease
--                           (token as its decimal text: a bulk string, not an integer reply)
--          {1, token, n, pttl}  replay: this holder already holds the lock (the same request
--                           ran before and its reply was lost, or a release granted it); pttl
--                           is what is left of its lease (not renewed by this send); nothing
--                           changes but the record
--          {0, pttl}        held by another holder; pttl is its remaining lease in ms
--                           (-1 when the key has no expiry, which only an operator can cause)
--          {-2}             this acquisition was cancelled (cancel.lua), or it ran before and its
--                           hold has ended since (released or expired): a late duplicate of the
--                           request; nothing done
-- Errors   FENCELOCK_WRONGTYPE  a key holds a value this protocol did not write; nothing modified
--          FENCELOCK_OVERFLOW   the next token would not be exact in a Lua double; nothing modified
--
-- The token is max(counter + 1, server TIME in microseconds) (lib/next_token.lua says why),
-- issued and written to the counter by take_token() there. Every read that can fail comes
-- before the first write, and take_token() puts back a counter it refuses, so an error leaves
-- nothing half-done. The checks and the hold's writes are lib/acquire.lua's (lock_open,
-- lock_grant), which the loader prepends to this file with lib/next_token.lua.
--
-- Why a first send records nothing: a copy of this request can only arrive after the hold
-- ended if the client sent it more than once, and every send after the first is a recorded
-- one. While the hold lasts, the holder in the hash makes any copy a replay; once a release
-- ended it, its mark "r:<op id>" is the record; a cancel leaves "c". What is left is a send
-- whose reply was lost and whose hold then expired unseen: a recorded re-send takes the lock
-- anew, with a greater token, which is right, since nobody ever acted under the first one.
local reply, held = lock_open(KEYS[1], KEYS[3], ARGV[1], ARGV[3], ARGV[4] == '1')
if reply or held then
  return reply or {0, redis.call('PTTL', KEYS[1])}
end
local token, err = take_token(KEYS[2])
if not token then
  return err
end
lock_grant(KEYS[1], ARGV[1], token, ARGV[5], ARGV[2], ARGV[4] == '1' and KEYS[3], ARGV[3])
return {1, token, 1}
