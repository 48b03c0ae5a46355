-- fair_lock_give_up: a waiter leaves the line (its wait ended, it was cancelled, or it failed).
-- KEYS[1]  the lock key
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- KEYS[5]  aiolock_lock_alive:{name} (zset owner -> heartbeat, server Unix ms)
-- ARGV[1]  the message that wakes a waiter, "0"
-- ARGV[2]  owner id
-- ARGV[3]  the waiter's own allowance in ms (what it added to the deadlines behind it)
-- ARGV[4]  now: Unix ms on the caller's clock
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  1 if it was in line, 0 if not.
-- Everyone behind it moves up one place: their deadlines come sooner by its own allowance
-- (Redisson's asynchronous path subtracts its 5-minute default instead). If it was first in
-- line and the lock is free, the new first waiter is woken. Harmless when sent again: a
-- waiter no longer in line moves nobody. Its first writes remove (no memory needed), so it
-- runs on a server out of memory (moving the deadlines is then skipped).
--@include server_ms
--@include fair_line
local owner = ARGV[2]
local queue = redis.call('lrange', KEYS[2], 0, -1)
local position = nil
for i = 1, #queue do
    if queue[i] == owner then
        position = i
        break
    end
end
redis.call('zrem', KEYS[5], owner)
redis.call('zrem', KEYS[3], owner)
if position == nil then
    return 0
end
redis.call('lrem', KEYS[2], 0, owner)
local allowance = tonumber(ARGV[3])
if allowance > 0 then
    for i = position + 1, #queue do
        if redis.call('zscore', KEYS[3], queue[i]) ~= false then
            redis.pcall('zincrby', KEYS[3], -allowance, queue[i])
        end
    end
end
if position == 1 and redis.call('exists', KEYS[1]) == 0 then
    local head = first_waiter(KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[4]), server_ms(), nil)
    if head ~= false then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
    end
end
return 1
