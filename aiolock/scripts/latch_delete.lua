-- latch_delete: delete a countdown latch, which opens it.
-- KEYS[1]  the latch: a string holding the count (absent: open)
-- KEYS[2]  the client's request latches on it (see latch_try_set.lua)
-- ARGV[1]  how long the request latches are kept after the client's last write, ms
-- ARGV[2]  the publish command
-- ARGV[3]  the latch's channel (an argument, see latch_try_set.lua)
-- ARGV[4]  request id
-- ARGV[5..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  1 if a count was deleted, 0 if the latch was open already. Deleting publishes 0
--          ("open"), where Redisson publishes 1 ("closed"), which leaves its waiters
--          blocked on a latch whose count reads 0: waiters of both re-check and return.
local done = redis.call('hget', KEYS[2], ARGV[4])
if done then
    return tonumber(done)
end
redis.call('hdel', KEYS[2], unpack(ARGV, 4))
local deleted = redis.call('del', KEYS[1])
if deleted == 1 then
    redis.call(ARGV[2], ARGV[3], 0)
end
redis.call('hset', KEYS[2], ARGV[4], deleted)
redis.call('pexpire', KEYS[2], ARGV[1])
return deleted
