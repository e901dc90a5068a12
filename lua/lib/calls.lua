-- lib/calls.lua: how the scripts make the calls that many of them make. The loader
-- (src/protocol/scripts.rs) prepends it, first of the libraries, to every script that uses it
-- (directly or through another library), since Redis scripts cannot import.
--
-- refused(reply, what) answers a redis.pcall that failed (`reply`, its error reply):
-- "FENCELOCK_WRONGTYPE <what>" when the key holds another type (WRONGTYPE), the server's own
-- error (an ACL refusal) as it is otherwise. Where a script's first read of a key is a command
-- that fails on the wrong type anyway, that read, under redis.pcall, is its type check rather
-- than a TYPE before it: one server call less, the same refusal, still before any write
-- (DESIGN.md section 3). Each such read is
--     local value = redis.pcall(command, key, ...)
--     if type(value) == 'table' and value.err then
--       return refused(value, '<key> is not a ...')
--     end
-- The libraries of the scripts that run on every acquisition and release or fenced call
-- (lib/next_token.lua, lib/release.lua, lib/fence_mark.lua) make the same refusal in line
-- instead: a function a script defines costs every call of the script (Lua makes its closure
-- each time, the more so the more locals it captures), so those define no more than they call.
--
-- publish(mode, channel, message) announces `message` on `channel`: with SPUBLISH when `mode`
-- is "sharded" (Redis Cluster: the channel is a key of the script's own slot), else PUBLISH.
local function refused(reply, what)
  if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('FENCELOCK_WRONGTYPE ' .. what)
  end
  return reply
end

local function publish(mode, channel, message)
  redis.call(mode == 'sharded' and 'SPUBLISH' or 'PUBLISH', channel, message)
end
