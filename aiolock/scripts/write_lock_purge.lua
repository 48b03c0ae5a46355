-- write_lock_purge: remove every write hold of an owner (cleaning up a lost or abandoned
-- hold); the lock is deleted, or left in read mode if the owner also holds read holds, and
-- "1" published.
-- KEYS[1]  the lock key
-- KEYS[2]  the channel, redisson_rwlock:{name}
-- ARGV[1]  the message, "1"
-- ARGV[2]  the writer, <owner>:write
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  0 if it held no write count; 2 if its holds were removed (message published).
-- HDEL first, so the rest runs on a server out of memory (a downgrade that cannot be written
-- deletes the lock).
if redis.call('hdel', KEYS[1], ARGV[2]) == 0 then
    return 0
end
if redis.call('hlen', KEYS[1]) <= 1 then
    redis.call('del', KEYS[1])
elseif type(redis.pcall('hset', KEYS[1], 'mode', 'read')) == 'table' then
    redis.call('del', KEYS[1])
end
redis.call(ARGV[3], KEYS[2], ARGV[1])
return 2
