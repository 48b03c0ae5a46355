-- lock_acquire: take or re-enter a reentrant lock (Redisson's RLock layout).
-- KEYS[1]  the lock key: a hash, field = owner id, value = hold count; TTL = lease
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id "<client uuid>:<task id>"
-- Returns  nil when acquired (the owner's count +1, the TTL reset to the lease),
--          otherwise the current holder's remaining TTL in milliseconds (-1: no TTL).
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return nil
end
return redis.call('pttl', KEYS[1])
