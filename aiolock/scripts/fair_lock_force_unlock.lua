-- fair_lock_force_unlock: delete a fair lock whoever holds it, and wake the first waiter.
-- KEYS[1]  the lock key
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- KEYS[5]  aiolock_lock_alive:{name} (zset owner -> heartbeat, server Unix ms)
-- ARGV[1]  the message that wakes a waiter, "0"
-- ARGV[2]  now: Unix ms on the caller's clock
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if a lock was deleted, 0 if there was none.
--@include server_ms
--@include fair_line
local head = first_waiter(KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[2]), server_ms(), nil)
local pttl = redis.call('pttl', KEYS[1])
if redis.call('del', KEYS[1]) == 0 then
    return 0
end
if pttl > 0 then
    shift_deadlines(KEYS[3], KEYS[5], -pttl)
end
if head ~= false then
    redis.call(ARGV[3], KEYS[4] .. ':' .. head, ARGV[1])
end
return 1
