-- lock_release: drop one hold of a reentrant lock; the last one deletes it and publishes.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  the lock's channel, redisson_lock__channel:{name}
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  lease in milliseconds, set again while holds remain
-- ARGV[3]  owner id
-- Returns  nil if the owner holds no count; 0 if holds remain (count -1, TTL reset);
--          1 if this was the last hold (key deleted, message published).
-- The last release uses only DEL and PUBLISH, which a server out of memory still allows
-- (HINCRBY is refused under OOM), so a lock can always be released.
local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    return nil
end
if count > 1 then
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 0
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], ARGV[1])
return 1
