-- permit_counts: a permit-expirable semaphore's counts, after returning expired permits.
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  its permits, {name}:timeout (sorted set: permit id -> expiry, ms)
-- KEYS[3]  its channel, redisson_sc:{name}
-- ARGV[1]  the publish command
-- ARGV[2]  how many expired permits one call returns to the pool at most
-- Returns  {available permits, permits taken}; expired permits are returned to the pool
--          first (the new count is published).
--@include server_ms
local now = server_ms()
local expired = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'limit', 0, ARGV[2])
if #expired > 0 then
    redis.call('zrem', KEYS[2], unpack(expired))
    local available = redis.call('incrby', KEYS[1], #expired)
    if available > 0 then
        redis.call(ARGV[1], KEYS[3], available)
    end
end
return {tonumber(redis.call('get', KEYS[1]) or '0'), redis.call('zcard', KEYS[2])}
