-- lock_purge: remove every count an owner has on a lock (cleaning up a lost or abandoned
-- hold); if that frees the lock, wake a waiter.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  the lock's channel
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  owner id
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  0 if the owner held nothing; 1 if its counts were removed and others still hold
--          the lock; 2 if that freed the lock (message published).
-- Uses only HDEL and PUBLISH, which a server out of memory still allows.
if redis.call('hdel', KEYS[1], ARGV[2]) == 0 then
    return 0
end
if redis.call('exists', KEYS[1]) == 1 then
    return 1
end
redis.call(ARGV[3], KEYS[2], ARGV[1])
return 2
