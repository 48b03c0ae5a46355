-- semaphore_try_set: set a semaphore's permits if it has none set yet (Redisson's
-- trySetPermits; also the permit-expirable semaphore's, which shares the layout).
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  its channel, redisson_sc:{name}
-- KEYS[3]  the client's request latches on it (see semaphore_acquire.lua)
-- ARGV[1]  permits
-- ARGV[2]  how long the latches are kept after the client's last write, ms
-- ARGV[3]  the publish command
-- ARGV[4]  request id
-- ARGV[5..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  1 if set (the count is published), 0 if the semaphore already had a count.
local done = redis.call('hget', KEYS[3], ARGV[4])
if done then
    return tonumber(done)
end
local set = 0
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call(ARGV[3], KEYS[2], ARGV[1])
    set = 1
end
if #ARGV > 4 then
    redis.call('hdel', KEYS[3], unpack(ARGV, 5))
end
redis.call('hset', KEYS[3], ARGV[4], set)
redis.call('pexpire', KEYS[3], ARGV[2])
return set
