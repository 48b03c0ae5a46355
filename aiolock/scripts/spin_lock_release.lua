-- spin_lock_release: drop one hold of a spin lock (Redisson's RSpinLock: the reentrant lock's
-- hash, whose waiters try again after a pause instead of listening): nothing is published.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- ARGV[1]  lease in milliseconds: while holds remain the TTL is extended to it if shorter
-- ARGV[2]  owner id
-- ARGV[3]  the owner's count the caller expects (compare and decrement: a release that
--          arrives late, or twice, finds another count and changes nothing)
-- Returns  nil if the owner holds no count; -1 if it holds another count than expected
--          (nothing changed); 0 if holds remain (count -1); 1 if this was the last hold
--          (the key deleted, or only the owner's field if someone else's is in the hash too).
-- The last release uses only HGET, HLEN, DEL and HDEL, which a server out of memory still
-- allows, so a spin lock can always be released.
local count = tonumber(redis.call('hget', KEYS[1], ARGV[2]))
if count == nil then
    return nil
end
if count ~= tonumber(ARGV[3]) then
    return -1
end
if count > 1 then
    -- PEXPIRE first: a write that needs no memory, after which a server out of memory
    -- lets the script's HINCRBY through (Redis refuses only a script's first write)
    redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1])))
    redis.call('hincrby', KEYS[1], ARGV[2], -1)
    return 0
end
if redis.call('hlen', KEYS[1]) > 1 then
    redis.call('hdel', KEYS[1], ARGV[2])
    return 1
end
redis.call('del', KEYS[1])
return 1
