-- write_lock_release: drop one hold of the write lock; the last one deletes the lock, or, if
-- the writer also holds read holds, leaves it in read mode (a downgrade). Either way "1" is
-- published: every waiter re-checks (waiting readers may all come in now).
-- KEYS[1]  the lock key (see read_lock_acquire.lua)
-- KEYS[2]  the channel, redisson_rwlock:{name}
-- ARGV[1]  the message, "1"
-- ARGV[2]  lease in milliseconds: while write holds remain the TTL is extended to it if shorter
-- ARGV[3]  the writer, <owner>:write
-- ARGV[4]  the writer's count the caller expects (compare and decrement: a release that
--          arrives late, or twice, finds another count and changes nothing)
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  nil if it holds no write count; -1 if it holds another count than expected
--          (nothing changed); 0 if write holds remain (count -1); 1 if this was the last.
-- The last release deletes before anything that needs memory (on a server out of memory a
-- downgrade that cannot be written deletes the lock, read holds included: they are lost).
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call(ARGV[5], KEYS[2], ARGV[1])
    return nil
end
if mode ~= 'write' then
    return nil
end
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    return nil
end
if count ~= tonumber(ARGV[4]) then
    return -1
end
if count > 1 then
    -- PEXPIRE first: a write that needs no memory, after which a server out of memory
    -- lets the script's HINCRBY through (Redis refuses only a script's first write)
    redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[2])))
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
elseif type(redis.pcall('hset', KEYS[1], 'mode', 'read')) == 'table' then
    redis.call('del', KEYS[1])
end
redis.call(ARGV[5], KEYS[2], ARGV[1])
return 1
