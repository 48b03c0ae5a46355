-- read_lock_acquire: take or re-enter the read lock of a read-write lock (Redisson's
-- RReadWriteLock layout).
-- KEYS[1]  the lock key: a hash, 'mode' = 'read' | 'write', a reader's field <owner> -> its
--          hold count, the writer's <owner>:write -> its hold count; TTL = the longest
--          remaining hold
-- KEYS[2]  this reader's timeout prefix, {name}:<owner>:rwlock_timeout: its k-th hold has the
--          string KEYS[2]:k whose TTL is that hold's lease
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (the reader)
-- ARGV[3]  the same owner as a writer, <owner>:write
-- Returns  nil when acquired: the lock is free, or in read mode (readers share it, also while
--          a writer waits: Redisson's rule), or in write mode held by this very owner (it may
--          read what it writes; unlocking the write lock then leaves it in read mode);
--          otherwise the writer's remaining TTL in milliseconds.
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false or mode == 'read' or redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
    if mode == false then
        redis.call('hset', KEYS[1], 'mode', 'read')
    end
    local hold = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('set', KEYS[2] .. ':' .. hold, 1, 'px', ARGV[1])
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return nil
end
return redis.call('pttl', KEYS[1])
