-- read_lock_force_unlock: delete a read-write lock held in read mode, whoever reads it, and
-- wake every waiter.
-- KEYS[1]  the lock key
-- KEYS[2]  the channel, redisson_rwlock:{name}
-- ARGV[1]  the message, "1" (wake every waiter)
-- ARGV[2]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if it was deleted; 0 if there was no lock; -1 if it is held in write mode
--          (then nothing is done).
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    return 0
end
if mode ~= 'read' then
    return -1
end
redis.call('del', KEYS[1])
redis.call(ARGV[2], KEYS[2], ARGV[1])
return 1
