-- fair_lock_give_up: a waiter leaves the line (its wait ended, it was cancelled, or it failed).
-- KEYS[1]  the lock key
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- ARGV[1]  the message that wakes a waiter, "0"
-- ARGV[2]  owner id
-- ARGV[3]  the waiter's own allowance in ms (what it added to the deadlines behind it)
-- ARGV[4]  now: Unix ms on the caller's clock
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if it was in line, 0 if not.
-- Everyone behind it moves up one place: their deadlines come sooner by its own allowance
-- (Redisson's asynchronous path subtracts its 5-minute default instead). If it was first in
-- line and the lock is free, the new first waiter is woken.
local owner = ARGV[2]
local queue = redis.call('lrange', KEYS[2], 0, -1)
local position = nil
for i = 1, #queue do
    if queue[i] == owner then
        position = i
        break
    end
end
if position == nil then
    redis.call('zrem', KEYS[3], owner)
    return 0
end
local allowance = tonumber(ARGV[3])
if allowance > 0 then
    for i = position + 1, #queue do
        if redis.call('zscore', KEYS[3], queue[i]) ~= false then
            redis.call('zincrby', KEYS[3], -allowance, queue[i])
        end
    end
end
redis.call('zrem', KEYS[3], owner)
redis.call('lrem', KEYS[2], 0, owner)
if position == 1 and redis.call('exists', KEYS[1]) == 0 then
    local now = tonumber(ARGV[4])
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
    if head ~= false then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
    end
end
return 1
