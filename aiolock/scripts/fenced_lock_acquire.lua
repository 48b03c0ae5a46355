-- fenced_lock_acquire: take or re-enter a reentrant lock and return its fencing token.
-- KEYS[1]  the lock key (hash: owner id -> hold count; TTL = lease)
-- KEYS[2]  the token counter, redisson_lock_token:{name} (a Redis integer, no TTL)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- Returns  {1, token} when acquired, the token as a string of digits (exact whatever its
--          size; Lua's numbers are doubles): a first hold takes a new token and sets the
--          TTL, a reentrant hold gets the counter's current value and only extends the TTL;
--          otherwise {0, the holder's remaining TTL in ms}.
--
-- A new token is max(counter + 1, the server's clock in microseconds since the Unix epoch),
-- and the counter is set to it: INCR when the counter is at or ahead of the clock (as
-- Redisson's INCR does), SET to the clock when the counter is behind it or missing. So a
-- counter lost with its server (a restart without persistence, a failover to a replica that
-- missed the last tokens) starts again above the tokens handed out before, as long as the
-- clock went forward, and a clock stepped back while the counter exists changes nothing (the
-- counter goes on by one). The clock reading (< 2^53 until the year 2255) is exact in Lua's
-- doubles, in an int64 and in an IEEE double; INCR counts on the server, exactly.
-- TIME is not deterministic: the script asks for effects replication (the default of Redis 5
-- to 6.2, the only mode of Redis 7 and Valkey), so replicas and the AOF receive the SET or
-- INCR it did, never the script to run again.
redis.replicate_commands()
local function new_token()
    local last = redis.call('get', KEYS[2])
    local counted = last and tonumber(last)
    if last and not counted then
        redis.call('incr', KEYS[2])  -- not an integer: INCR's own error, and nothing written
    end
    local now = redis.call('time')
    local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
    if counted and counted >= micros then
        redis.call('incr', KEYS[2])
        return redis.call('get', KEYS[2])
    end
    local token = string.format('%d', micros)
    redis.call('set', KEYS[2], token)
    return token
end
if redis.call('exists', KEYS[1]) == 0 then
    local token = new_token()  -- first: on a refused write (OOM) nothing else is written
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, token}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    local last = redis.call('get', KEYS[2])
    return {1, (last and string.find(last, '^%-?%d+$') and last) or '0'}
end
return {0, redis.call('pttl', KEYS[1])}
