-- batch.lua: several acquisitions and releases of one client in one script call, each applied
-- exactly as its own script applies it, each with its own reply.
--
-- The loader (src/protocol/scripts.rs) builds this script from the text of acquire.lua and
-- release.lua, unchanged: each becomes a function of its own KEYS and ARGV (op_acquire and
-- op_release, defined above this text; next_token once above both). So an operation in a batch
-- runs the same lines as the same operation alone, with the same contract, and a broken
-- variant of either script (the negative controls) breaks its batched use too.
--
-- KEYS     every operation's keys, in operation order (acquire.lua's 3, release.lua's 3); on
--          a cluster they all hash to one slot (the client batches per slot)
-- ARGV[1]  n, the number of operations
--          then per operation: its kind ("a": acquire.lua, "r": release.lua), its number of
--          keys k, its number of arguments m, and its m arguments; its keys are the next k of
--          KEYS. Arguments are exactly what the operation's own script takes (an acquisition
--          without a label has 4, with one 5)
--
-- Returns  an array of n replies in operation order: each the reply the operation's own script
--          gives ({1, token, count}, {0, pttl}, {-2}; {1, n}, {-1}), or the error of that
--          operation alone as its message, a string ("FENCELOCK_WRONGTYPE ...", a refused
--          command's "NOPERM ..."; a string, not an error reply, because a client library may
--          take an error anywhere in a reply for the whole call's). Each script makes every
--          read that can fail before its first write, so such an error left nothing of that
--          operation behind, and the others ran on.
-- Errors   FENCELOCK_BADARG     the operation list is malformed (a client bug); nothing run
--
-- Operations run in the order given, each seeing what the ones before it wrote: a batch is
-- the same as its operations sent one after another on one connection, with nothing of any
-- other client between them. Every operation keeps its own id, and so its replay: a re-sent
-- operation (alone or in another batch) finds its record or its hold exactly as it would have
-- after running alone.
local operations = {a = op_acquire, r = op_release}

local n = tonumber(ARGV[1])
if not n then
  return redis.error_reply('FENCELOCK_BADARG batch.lua needs the number of operations first')
end
-- Check the whole list before running anything, so a malformed one runs nothing.
local key_at, arg_at = 1, 2
local plan = {}
for i = 1, n do
  local run = operations[ARGV[arg_at]]
  local nkeys = tonumber(ARGV[arg_at + 1])
  local nargs = tonumber(ARGV[arg_at + 2])
  if not run or not nkeys or not nargs or key_at + nkeys - 1 > #KEYS
      or arg_at + 2 + nargs > #ARGV then
    return redis.error_reply('FENCELOCK_BADARG batch.lua operation ' .. i .. ' is malformed')
  end
  plan[i] = {run, key_at, nkeys, arg_at + 3, nargs}
  key_at = key_at + nkeys
  arg_at = arg_at + 3 + nargs
end

local replies = {}
for i = 1, n do
  local run, first_key, nkeys, first_arg, nargs = unpack(plan[i])
  local op_keys = {unpack(KEYS, first_key, first_key + nkeys - 1)}
  local op_args = {unpack(ARGV, first_arg, first_arg + nargs - 1)}
  local ok, reply = pcall(run, op_keys, op_args)
  if not ok then
    -- A raised error: a table with its message in `err` (Redis 7+), or its text (Redis 6.2).
    reply = type(reply) == 'table' and reply.err or tostring(reply)
  elseif reply.err then
    reply = reply.err -- an error reply the operation returned
  end
  replies[i] = reply
end
return replies
