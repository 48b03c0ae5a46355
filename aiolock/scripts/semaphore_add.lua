-- semaphore_add: add permits to a semaphore, or take some away (a negative number).
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  its channel, redisson_sc:{name}
-- KEYS[3]  the client's request latches on it (see semaphore_acquire.lua)
-- ARGV[1]  permits to add (negative: to remove)
-- ARGV[2]  how long the latches are kept after the client's last write, ms
-- ARGV[3]  the publish command
-- ARGV[4]  request id
-- ARGV[5..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  {1, the new count} (published when permits were added), or {0, the available
--          count} when fewer permits are available than asked to remove: nothing changed.
local done = redis.call('hget', KEYS[3], ARGV[4])
if done then
    return {1, tonumber(done)}
end
local available = tonumber(redis.call('get', KEYS[1]) or '0')
local delta = tonumber(ARGV[1])
if available + delta < 0 then
    if #ARGV > 4 then
        redis.call('hdel', KEYS[3], unpack(ARGV, 5))
    end
    return {0, available}
end
available = redis.call('incrby', KEYS[1], delta)
if delta > 0 then
    redis.call(ARGV[3], KEYS[2], available)
end
if #ARGV > 4 then
    redis.call('hdel', KEYS[3], unpack(ARGV, 5))
end
redis.call('hset', KEYS[3], ARGV[4], available)
redis.call('pexpire', KEYS[3], ARGV[2])
return {1, available}
