-- lib/clock.lua: the server clock, and integers as the text the scripts hand to Redis. The
-- loader (src/protocol/scripts.rs) prepends it to every script that uses it (directly or
-- through another library), since Redis scripts cannot import.
--
-- now_ms(t) is the server time in milliseconds (the clock of leases and deadlines) and
-- micros(t) in microseconds (the clock floor of fencing tokens, the order of fair queues);
-- `t`, optional, is the reply of a TIME the script already made (one call less), else they
-- call TIME. Both are exact: below 2^53 in a Lua double.
--
-- int_text(n) is an integer's decimal text. A number given to redis.call is formatted with
-- "%.17g" (Redis 6.2 and 7.0), and Lua's own tostring with "%.14g": both take glibc's
-- floating-point path, several times the cost of "%d" (which Lua formats as a C long, 64
-- bits on a 64-bit server), and a hot script formats a few numbers per call.
local function now_ms(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function micros(t)
  t = t or redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int_text(n)
  return string.format('%d', n)
end
