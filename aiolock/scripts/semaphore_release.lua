-- semaphore_release: give permits back to a semaphore and announce the new count.
-- KEYS[1]  the semaphore: a string holding the available permits
-- KEYS[2]  its channel, redisson_sc:{name}
-- KEYS[3]  the client's request latches on it (see semaphore_acquire.lua)
-- ARGV[1]  permits to give back
-- ARGV[2]  how long the latches are kept after the client's last write, ms
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- ARGV[4]  request id
-- ARGV[5..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  the new number of available permits, which is also published. A request that
--          already ran returns what it returned then and changes nothing (never adds twice).
-- The first write is an HDEL (of the ids to forget and of this request's own, absent, id),
-- which needs no memory: a server out of memory then lets the whole script run, so
-- permits can always be given back.
local done = redis.call('hget', KEYS[3], ARGV[4])
if done then
    return tonumber(done)
end
redis.call('hdel', KEYS[3], unpack(ARGV, 4))
local available = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[3], KEYS[2], available)
redis.call('hset', KEYS[3], ARGV[4], available)
redis.call('pexpire', KEYS[3], ARGV[2])
return available
