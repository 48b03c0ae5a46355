-- read_lock_release: drop one read hold; when no live read hold is left the lock is deleted
-- and "0" published (wakes one waiter: a writer).
-- KEYS[1]  the lock key (see read_lock_acquire.lua)
-- KEYS[2]  the channel, redisson_rwlock:{name}
-- KEYS[3]  this reader's timeout prefix, {name}:<owner>:rwlock_timeout
-- KEYS[4]  the prefix of every reader's timeout keys, {name} (<prefix>:<owner>:rwlock_timeout:k)
-- ARGV[1]  the message, "0"
-- ARGV[2]  lease in milliseconds: the owner's remaining holds are extended to it if shorter
-- ARGV[3]  owner id
-- ARGV[4]  the owner's count the caller expects (compare and decrement: a release that
--          arrives late, or twice, finds another count and changes nothing)
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  nil if the owner holds no read count; -1 if it holds another count than
--          expected (nothing changed); 0 if it still holds some (count -1);
--          1 if this was its last (the lock's TTL is then the longest remaining read hold's,
--          or the lock is deleted when none is left).
-- Timeout keys of other readers are named here, not in KEYS (Redisson's script does the
-- same; they share the lock's hash slot). The first write is a deletion, so on a server out
-- of memory the rest still runs (Redis refuses memory-growing commands only before a
-- script's first write).
--@include read_lock_rest
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call(ARGV[5], KEYS[2], ARGV[1])
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    return nil
end
if count ~= tonumber(ARGV[4]) then
    return -1
end
local lease = tonumber(ARGV[2])
redis.call('del', KEYS[3] .. ':' .. count)
if count > 1 then
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    for i = 1, count - 1 do
        local key = KEYS[3] .. ':' .. i
        if redis.call('pttl', key) < lease then
            redis.call('set', key, 1, 'px', lease)
        end
    end
    if redis.call('pttl', KEYS[1]) < lease then
        redis.call('pexpire', KEYS[1], lease)
    end
    return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
read_lock_rest(KEYS[1], KEYS[4], KEYS[2], ARGV[1], ARGV[5])
return 1
