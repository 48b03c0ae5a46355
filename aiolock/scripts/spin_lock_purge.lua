-- spin_lock_purge: remove every count an owner has on a spin lock (cleaning up a lost or
-- abandoned hold); nothing is published (its waiters try again after a pause).
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- ARGV[1]  owner id
-- Returns  0 if the owner held nothing; 1 if its counts were removed and others still hold
--          the lock; 2 if that freed the lock.
-- Uses only HDEL and EXISTS, which a server out of memory still allows.
if redis.call('hdel', KEYS[1], ARGV[1]) == 0 then
    return 0
end
if redis.call('exists', KEYS[1]) == 1 then
    return 1
end
return 2
