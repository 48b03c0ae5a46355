-- lock_force_unlock: delete a lock whoever holds it, and wake its waiters.
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's channel, redisson_lock__channel:{name}
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if a lock was deleted (message published), 0 if there was none.
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[2], KEYS[2], ARGV[1])
    return 1
end
return 0
