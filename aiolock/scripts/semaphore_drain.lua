-- semaphore_drain: take every available permit of a semaphore at once.
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  the client's request latches on it (see semaphore_acquire.lua)
-- ARGV[1]  how long the latches are kept after the client's last write, ms
-- ARGV[2]  request id
-- ARGV[3..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  the number of permits taken (0 if none were available).
local done = redis.call('hget', KEYS[2], ARGV[2])
if done then
    return tonumber(done)
end
local available = tonumber(redis.call('get', KEYS[1]) or '0')
if available <= 0 then
    available = 0
else
    redis.call('set', KEYS[1], 0, 'keepttl')
end
if #ARGV > 2 then
    redis.call('hdel', KEYS[2], unpack(ARGV, 3))
end
redis.call('hset', KEYS[2], ARGV[2], available)
redis.call('pexpire', KEYS[2], ARGV[1])
return available
