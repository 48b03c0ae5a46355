-- semaphore_acquire: take permits of a semaphore (Redisson's RSemaphore layout).
-- KEYS[1]  the semaphore: a string holding the available permits (absent: none)
-- KEYS[2]  the client's request latches on it, {name}:aiolock_requests:<client id>: a hash,
--          request id -> what the request did (see aiolock/requests.py)
-- ARGV[1]  permits to take
-- ARGV[2]  how long the latches are kept after the client's last write, ms
-- ARGV[3]  request id
-- ARGV[4..] ids of the client's earlier requests on this object whose replies arrived:
--          their latches are forgotten
-- Returns  1 if the permits were taken (the request's latch records it), 0 if fewer are
--          available, -1 if the semaphore has no count at all (never set, or deleted: no
--          permits, as for Redisson); nothing is recorded then. A request that already took
--          them returns 1 again and takes nothing more. On a server out of memory, the
--          DECRBY, its first write, is refused: no permits are taken there.
if redis.call('hexists', KEYS[2], ARGV[3]) == 1 then
    return 1
end
local wanted = tonumber(ARGV[1])
local available = redis.call('get', KEYS[1])
local taken = tonumber(available or '0') >= wanted
if taken then
    redis.call('decrby', KEYS[1], wanted)
end
if #ARGV > 3 then
    redis.call('hdel', KEYS[2], unpack(ARGV, 4))
end
if not taken then
    if not available then
        return -1
    end
    return 0
end
redis.call('hset', KEYS[2], ARGV[3], 1)
redis.call('pexpire', KEYS[2], ARGV[2])
return 1
