-- permissions.lua: which commands of the lock protocol the calling Redis user may not run on
-- the protocol's keys. Run once at connect (LockClient::connect and friends), so that a partial
-- ACL grant is refused up front, naming what is missing, instead of surfacing midway through a
-- script: a script refused after its first write keeps that write (Redis does not roll scripts
-- back), and a lock hash whose PEXPIRE was refused would never expire. Writes nothing.
--
-- KEYS[1]  a lock hash        (a probe name's; the keys need not exist)
-- KEYS[2]  its fence counter
-- KEYS[3]  an op record in its slot
-- KEYS[4]  its fair-handoff queue
-- ARGV[1]  "sharded": releases publish with SPUBLISH (cluster), anything else: PUBLISH
-- ARGV[2]  "1": the client runs in fair-handoff mode, so the queue commands are checked too
--
-- Returns  {}                 every command is allowed on these keys and channel
--          {"HSET", ...}      the commands (upper case) the user may not run on them
--          {"?"}              the server cannot tell (no redis.acl_check_cmd: Redis < 7.0)
--
-- Each probe passes the arguments a real call passes, so the key and channel rules of the ACL
-- are checked as well as the command rules (redis.acl_check_cmd checks all three).
if not redis.acl_check_cmd then
  return {'?'}
end

local refused = {}
local function check(command, ...)
  -- pcall: a command this server does not know (SPUBLISH before 7.0) is refused, not an error.
  local ok, allowed = pcall(redis.acl_check_cmd, command, ...)
  if not (ok and allowed) then
    table.insert(refused, command)
  end
end

check('TIME')
check('TYPE', KEYS[1])
check('HGET', KEYS[1], 'f')
check('HEXISTS', KEYS[1], 'f')
check('HSET', KEYS[1], 'f', '1')
check('HINCRBY', KEYS[1], 'f', '1')
check('PTTL', KEYS[1])
check('PEXPIRE', KEYS[1], '1')
check('DEL', KEYS[1])
if ARGV[1] == 'sharded' then
  check('SPUBLISH', KEYS[1], 'released')
else
  check('PUBLISH', KEYS[1], 'released')
end
check('GET', KEYS[2])
check('SET', KEYS[2], '1')
check('GET', KEYS[3])
check('EXISTS', KEYS[3])
check('SET', KEYS[3], 'a', 'PX', '1')
if ARGV[2] == '1' then
  check('ZADD', KEYS[4], 'NX', '1', 'm')
  check('ZREM', KEYS[4], 'm')
  check('ZPOPMIN', KEYS[4])
  check('PEXPIRE', KEYS[4], '1')
end

-- One entry per command, in first-refused order.
local seen, names = {}, {}
for _, command in ipairs(refused) do
  if not seen[command] then
    seen[command] = true
    table.insert(names, command)
  end
end
return names
