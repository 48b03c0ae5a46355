-- permit_acquire: take one permit of a permit-expirable semaphore (Redisson's
-- RPermitExpirableSemaphore layout), after returning expired permits to the pool.
-- KEYS[1]  the semaphore: a string holding the available permits (absent: none)
-- KEYS[2]  its permits, {name}:timeout: a sorted set, member = permit id (16 raw bytes),
--          score = when the permit expires (ms since the epoch; 922337203685477: never)
-- KEYS[3]  its channel, redisson_sc:{name}
-- ARGV[1]  the permit id (16 raw bytes)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- ARGV[4]  how many expired permits one call returns to the pool at most
-- Returns  {1, 0} when the permit was taken (expiring a lease after the server's clock now);
--          {0, ms until the earliest permit expires, unset} when none is available, or
--          {0, -1, unset} when no permit ever expires by itself (wait for a release); unset
--          is 1 if the semaphore has no count at all (never set, or deleted), else 0.
-- Expired permits are returned to the pool first: the count grows by their number and the
-- new count is published. Times are the server's (TIME), so clients' clocks do not matter.
--@include server_ms
local now = server_ms()
local expired = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'limit', 0, ARGV[4])
if #expired > 0 then
    redis.call('zrem', KEYS[2], unpack(expired))
    local available = redis.call('incrby', KEYS[1], #expired)
    if available > 0 then
        redis.call(ARGV[3], KEYS[3], available)
    end
end
if redis.call('zscore', KEYS[2], ARGV[1]) then
    return {1, 0}
end
local count = redis.call('get', KEYS[1])
if tonumber(count or '0') >= 1 then
    redis.call('decr', KEYS[1])
    redis.call('zadd', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
    local ttl = redis.call('pttl', KEYS[1])
    if ttl > 0 then
        redis.call('pexpire', KEYS[2], ttl)
    end
    return {1, 0}
end
local unset = 0
if not count then
    unset = 1
end
local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
if first[1] and tonumber(first[2]) < 922337203685477 then
    return {0, math.max(0, tonumber(first[2]) - now), unset}
end
return {0, -1, unset}
