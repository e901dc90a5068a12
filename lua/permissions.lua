-- permissions.lua: which commands of the lock protocol the calling Redis user may not run on
-- the protocol's keys. Run once at connect (LockClient::connect and friends), so that a partial
-- ACL grant is refused up front, naming what is missing, instead of surfacing midway through a
-- script: a script refused after its first write keeps that write (Redis does not roll scripts
-- back), and a lock hash whose PEXPIRE was refused would never expire. Leaves no trace.
--
-- Two ways to ask, one answer:
-- * Redis 7.0+ and Valkey: redis.acl_check_cmd for each command with its real arguments;
--   nothing is written.
-- * Redis 6.2 (no redis.acl_check_cmd): each command runs once, under redis.pcall, on the probe
--   keys, and an ACL refusal is read from its error. Every write is undone before the script
--   ends: the probe's lock hash, op record and queue are deleted (DEL is checked first, and
--   nothing is written when the user may not delete), and the bucket's fence counter gets back
--   the value it had (or is deleted when it had none). A script is atomic, so no other client
--   ever sees a probe key or a changed counter. The only effect is one 'released' message on
--   the probe lock's channel, which no waiter listens to.
--
-- KEYS[1]  a lock hash        (a probe name's; the keys need not exist), or with ARGV[3] a
--          probe semaphore's hash
-- KEYS[2]  its fence counter
-- KEYS[3]  an op record in its slot
-- KEYS[4]  its fair-handoff queue, or with ARGV[3] the probe semaphore's lease zset
-- ARGV[1]  "sharded": releases publish with SPUBLISH (cluster), anything else: PUBLISH
-- ARGV[2]  "1": the client runs in fair-handoff mode, so the queue commands are checked too
-- ARGV[3]  "holds": the commands the semaphore and read-write lock scripts add are checked too
--          (run before a client's first such acquisition, not at connect, so that a user of
--          locks alone needs none of them); "holds+fields": and those of hash-field expiry
--          (a server that has it, where any client may create a semaphore that uses it)
--
-- Returns  {}                 every command is allowed on these keys and channel
--          {"HSET", ...}      the commands (upper case) the user may not run on them
--
-- Each probe passes the arguments a real call passes, so the key and channel rules of the ACL
-- are checked as well as the command rules.
local refused, seen = {}, {}
local run_probes = redis.acl_check_cmd == nil

-- Redis 6.2 words a refusal inside a script "The user executing the script can't run this
-- command or subcommand", "... can't access at least one of the keys ...", "... can't publish
-- to the channel ..."; NOPERM covers the later wordings.
local function acl_refusal(reply)
  local err = type(reply) == 'table' and type(reply.err) == 'string' and reply.err or ''
  return string.find(err, "can't", 1, true) ~= nil or string.find(err, 'NOPERM', 1, true) ~= nil
end

-- Records `command` as refused when the user may not run it with these arguments (the answer
-- names each refused command once, in first-refused order). Returns whether it may, and, run
-- as a probe, the command's reply.
local function check(command, ...)
  local allowed, reply
  if run_probes then
    reply = redis.pcall(command, ...)
    allowed = not acl_refusal(reply)
  else
    -- pcall: a command this server does not know (SPUBLISH before 7.0) is refused, not an
    -- error.
    local ok, answer = pcall(redis.acl_check_cmd, command, ...)
    allowed = ok and answer
  end
  if not allowed and not seen[command] then
    seen[command] = true
    table.insert(refused, command)
  end
  return allowed, reply
end

-- Checks each probe {command, n, argument...}, run on KEYS[n] with those arguments, in order.
local function check_all(probes)
  for _, probe in ipairs(probes) do
    check(probe[1], KEYS[probe[2]], unpack(probe, 3))
  end
end

local fence_before
if run_probes then
  -- Undoing the probes needs DEL on the probe keys and the counter's old value: without them
  -- (any refusal so far) nothing is written, and the refusals found are the answer.
  check_all({{'DEL', 1}, {'DEL', 3}, {'DEL', 4}})
  local readable
  readable, fence_before = check('GET', KEYS[2])
  if readable and type(fence_before) ~= 'string' then
    -- No counter yet: the probe's SET creates one, which must be deleted again.
    check('DEL', KEYS[2])
  end
  if #refused > 0 then
    return refused
  end
end

local far = '99999999999999'
check('TIME')
check_all({
  {'TYPE', 1}, {'HGET', 1, 'f'}, {'HEXISTS', 1, 'f'}, {'HSET', 1, 'f', '1'},
  {'HINCRBY', 1, 'f', '1'}, {'PTTL', 1}, {'PEXPIRE', 1, '1'}, {'DEL', 1},
  {ARGV[1] == 'sharded' and 'SPUBLISH' or 'PUBLISH', 1, 'released'}, {'GET', 2},
  -- Run as a probe (Redis 6.2), the SET writes the counter's own value back: nothing changes.
  -- With GET, as take_token() (lib/next_token.lua) issues: a key rule must let it read too.
  {'SET', 2, type(fence_before) == 'string' and fence_before or '1', 'KEEPTTL', 'GET'},
  {'GET', 3}, {'EXISTS', 3}, {'SET', 3, 'a', 'PX', '1'},
})
if ARGV[2] == '1' then
  check_all({{'ZADD', 4, 'NX', '1', 'm'}, {'ZREM', 4, 'm'}, {'ZPOPMIN', 4}, {'PEXPIRE', 4, '1'}})
end
if ARGV[3] == 'holds' or ARGV[3] == 'holds+fields' then
  check_all({
    {'EXISTS', 1}, {'HMGET', 1, 'f'}, {'MGET', 3}, {'HDEL', 1, 'f'}, {'PEXPIREAT', 1, far},
    {'ZADD', 4, '1', 'm'}, {'ZSCORE', 4, 'm'}, {'ZRANGE', 4, '0', '0', 'WITHSCORES'},
    {'ZRANGEBYSCORE', 4, '-inf', '1'}, {'ZREMRANGEBYSCORE', 4, '-inf', '1'}, {'ZREM', 4, 'm'},
    {'PEXPIREAT', 4, far},
  })
end
if ARGV[3] == 'holds+fields' then
  check_all({
    {'HVALS', 1}, {'HKEYS', 1}, {'HLEN', 1}, {'HPEXPIREAT', 1, far, 'FIELDS', '1', 'f'},
    {'HPEXPIRETIME', 1, 'FIELDS', '1', 'f'}, {'PEXPIRETIME', 1},
  })
end

if run_probes then
  redis.pcall('DEL', KEYS[1], KEYS[3], KEYS[4])
  if type(fence_before) == 'string' then
    redis.pcall('SET', KEYS[2], fence_before)
  else
    redis.pcall('DEL', KEYS[2])
  end
end
return refused
