-- write_lock_acquire: take or re-enter the write lock of a read-write lock (Redisson's
-- RReadWriteLock layout; see read_lock_acquire.lua for the hash).
-- KEYS[1]  the lock key
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the writer, <owner>:write
-- ARGV[3]  the same owner as a reader, <owner>
-- Returns  nil when acquired (the lock was free, or this writer re-enters: its TTL is
--          extended to the lease if shorter); 'READ_HELD' if the lock is in read mode and
--          this owner is one of its readers (it would wait for itself for ever); otherwise
--          the remaining TTL in milliseconds.
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'write')
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return nil
end
if mode == 'read' and redis.call('hexists', KEYS[1], ARGV[3]) == 1 then
    return 'READ_HELD'
end
return redis.call('pttl', KEYS[1])
