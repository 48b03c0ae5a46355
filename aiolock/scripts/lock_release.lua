-- lock_release: drop one hold of a reentrant lock; the last one deletes it and publishes.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  the lock's channel, redisson_lock__channel:{name}
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  lease in milliseconds: while holds remain the TTL is extended to it if shorter
-- ARGV[3]  owner id
-- ARGV[4]  the owner's count the caller expects (compare and decrement: a release that
--          arrives late, or twice, finds another count and changes nothing)
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  nil if the owner holds no count; -1 if it holds another count than expected
--          (nothing changed); 0 if holds remain (count -1); 1 if this was the last hold
--          (the key deleted and the message published, or only the owner's field if
--          someone else's is in the hash too).
-- The last release uses only HLEN, DEL, HDEL and PUBLISH, which a server out of memory
-- still allows (HINCRBY is refused under OOM), and an earlier one PEXPIREs before its
-- HINCRBY (allowed once the script has written), so a lock can always be released.
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
if redis.call('hlen', KEYS[1]) > 1 then
    redis.call('hdel', KEYS[1], ARGV[3])
    return 1
end
redis.call('del', KEYS[1])
redis.call(ARGV[5], KEYS[2], ARGV[1])
return 1
