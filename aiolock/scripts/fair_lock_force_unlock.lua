-- fair_lock_force_unlock: delete a fair lock whoever holds it, and wake the first waiter.
-- KEYS[1]  the lock key
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- ARGV[1]  the message that wakes a waiter, "0"
-- ARGV[2]  now: Unix ms on the caller's clock
-- ARGV[3]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if a lock was deleted, 0 if there was none.
local now = tonumber(ARGV[2])
local head
while true do
    head = redis.call('lindex', KEYS[2], 0)
    if head == false then
        break
    end
    local deadline = tonumber(redis.call('zscore', KEYS[3], head))
    if deadline ~= nil and deadline > now then
        break
    end
    redis.call('lpop', KEYS[2])
    redis.call('zrem', KEYS[3], head)
end
local pttl = redis.call('pttl', KEYS[1])
if redis.call('del', KEYS[1]) == 0 then
    return 0
end
if pttl > 0 then
    local waiting = redis.call('zrange', KEYS[3], 0, -1)
    for i = 1, #waiting do
        redis.pcall('zincrby', KEYS[3], -pttl, waiting[i])
    end
end
if head ~= false then
    redis.call(ARGV[3], KEYS[4] .. ':' .. head, ARGV[1])
end
return 1
