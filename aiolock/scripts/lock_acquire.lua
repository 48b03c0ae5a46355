-- lock_acquire: take or re-enter a reentrant lock (Redisson's RLock layout).
-- KEYS[1]  the lock key: a hash, field = owner id, value = hold count; TTL = lease
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id "<client uuid>:<n>"
-- Returns  nil when acquired: a first hold sets the TTL to the lease; a reentrant one only
--          extends it (a short nested lease never shortens the outer hold's),
--          otherwise the current holder's remaining TTL in milliseconds (-1: no TTL).
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return nil
end
return redis.call('pttl', KEYS[1])
