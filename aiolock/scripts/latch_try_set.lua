-- latch_try_set: set a countdown latch's count if it is open (Redisson's RCountDownLatch).
-- KEYS[1]  the latch: a string holding the count (absent: open)
-- KEYS[2]  the client's request latches on it, {name}:aiolock_requests:<client id> (see
--          aiolock/requests.py)
-- ARGV[1]  the count
-- ARGV[2]  how long the request latches are kept after the client's last write, ms
-- ARGV[3]  the publish command
-- ARGV[4]  the latch's channel, redisson_countdownlatch__channel__{name} (an argument, not
--          a key: for a name with a hash tag of its own it lies in another cluster slot)
-- ARGV[5]  request id
-- ARGV[6..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  1 if the count was set (1, "new count", is published), 0 if it was closed already.
local done = redis.call('hget', KEYS[2], ARGV[5])
if done then
    return tonumber(done)
end
local set = 0
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call(ARGV[3], ARGV[4], 1)
    set = 1
end
if #ARGV > 5 then
    redis.call('hdel', KEYS[2], unpack(ARGV, 6))
end
redis.call('hset', KEYS[2], ARGV[5], set)
redis.call('pexpire', KEYS[2], ARGV[2])
return set
