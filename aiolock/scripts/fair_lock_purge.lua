-- fair_lock_purge: remove every count an owner has on a fair lock (cleaning up a lost or
-- abandoned hold); if that frees the lock, wake the first waiter in line.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- KEYS[5]  aiolock_lock_alive:{name} (zset owner -> heartbeat, server Unix ms)
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  owner id
-- ARGV[3]  now: Unix ms on the caller's clock
-- ARGV[4]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  0 if the owner held nothing; 1 if its counts were removed and others still hold
--          the lock; 2 if that freed the lock (the first waiter woken).
-- HDEL comes first, then only deletions and PUBLISH (moving the deadlines is skipped on a
-- server out of memory), so it goes through under OOM.
--@include server_ms
--@include fair_line
local pttl = redis.call('pttl', KEYS[1])
if redis.call('hdel', KEYS[1], ARGV[2]) == 0 then
    return 0
end
if redis.call('exists', KEYS[1]) == 1 then
    return 1
end
local head = first_waiter(KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[3]), server_ms(), nil)
if pttl > 0 then
    shift_deadlines(KEYS[3], KEYS[5], -pttl)
end
if head ~= false then
    redis.call(ARGV[4], KEYS[4] .. ':' .. head, ARGV[1])
end
return 2
