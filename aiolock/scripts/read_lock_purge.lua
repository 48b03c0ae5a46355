-- read_lock_purge: remove every read hold of an owner (cleaning up a lost or abandoned
-- hold); if no live read hold is left, delete the lock and publish "0".
-- KEYS[1]  the lock key (see read_lock_acquire.lua)
-- KEYS[2]  the channel, redisson_rwlock:{name}
-- KEYS[3]  this reader's timeout prefix, {name}:<owner>:rwlock_timeout
-- KEYS[4]  the prefix of every reader's timeout keys, {name}
-- ARGV[1]  the message, "0"
-- ARGV[2]  owner id
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  0 if the owner held no read count; 1 if its holds were removed and the lock is
--          still held; 2 if that freed the lock (message published).
-- Only deletions, PTTL/PEXPIRE and PUBLISH: it runs on a server out of memory.
--@include read_lock_rest
local count = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
if count == nil then
    return 0
end
redis.call('hdel', KEYS[1], ARGV[2])
for i = 1, count do
    redis.call('del', KEYS[3] .. ':' .. i)
end
if read_lock_rest(KEYS[1], KEYS[4], KEYS[2], ARGV[1], ARGV[3]) then
    return 1
end
return 2
