-- permit_release: give back one permit of a permit-expirable semaphore; expired permits
-- are returned to the pool too. Also removes a lost or abandoned permit (idempotent).
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  its permits, {name}:timeout (sorted set: permit id -> expiry, ms)
-- KEYS[3]  its channel, redisson_sc:{name}
-- ARGV[1]  the permit id (16 raw bytes)
-- ARGV[2]  the publish command
-- ARGV[3]  how many expired permits one call returns to the pool at most
-- Returns  1 if the permit was held and is back in the pool; 0 if it had expired (back in
--          the pool now, but its lease was over); -1 if it is not held (released already,
--          expired and returned, or unknown). The new count is published when it grew.
-- The first write is a ZREM, which needs no memory: a server out of memory then lets the
-- whole script run, so permits can always be given back.
--@include server_ms
local now = server_ms()
local score = redis.call('zscore', KEYS[2], ARGV[1])
local returned = 0
if score then
    redis.call('zrem', KEYS[2], ARGV[1])
    returned = 1
end
local expired = redis.call('zrangebyscore', KEYS[2], '-inf', now, 'limit', 0, ARGV[3])
if #expired > 0 then
    redis.call('zrem', KEYS[2], unpack(expired))
    returned = returned + #expired
end
if returned > 0 then
    local available = redis.call('incrby', KEYS[1], returned)
    if available > 0 then
        redis.call(ARGV[2], KEYS[3], available)
    end
end
if not score then
    return -1
end
if tonumber(score) <= now then
    return 0
end
return 1
