-- fair_lock_give_up: waiters leave the line (their waits ended, they were cancelled, or
-- failed): one, or many of one client at once (one call, one pass over the line).
-- KEYS[1]  the lock key
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- KEYS[5]  aiolock_lock_alive:{name} (zset owner -> heartbeat, server Unix ms)
-- ARGV[1]  the message that wakes a waiter, "0"
-- ARGV[2]  owner id
-- ARGV[3]  the waiter's own allowance in ms (what it added to the deadlines behind it; 0:
--          unknown, it moves nobody)
-- ARGV[4]  now: Unix ms on the caller's clock
-- ARGV[5]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- ARGV[6], ARGV[7], ...  more waiters leaving: owner id, allowance, owner id, allowance, ...
-- Returns  how many of the owners given were in line (one alone: 1 if it was, 0 if not).
-- Everyone behind a leaving waiter moves up one place: their deadlines come sooner by its own
-- allowance (by the sum of the allowances of the leaving ones ahead of them; Redisson's
-- asynchronous path subtracts its 5-minute default instead). If the first in line left and
-- the lock is free, the new first waiter is woken. Harmless when sent again: a waiter no
-- longer in line moves nobody. Cost: one pass over the line and O(log n) per waiter behind
-- the first one leaving, whatever the number leaving (k give-ups sent one by one cost k
-- passes: 1,000 cancelled waiters of one client took 2 s of the server). Its first writes
-- remove (no memory needed), so it runs on a server out of memory (moving the deadlines is
-- then skipped).
--@include server_ms
--@include fair_line
local leaving = {}
local function leave(owner, allowance)
    redis.call('zrem', KEYS[5], owner)
    redis.call('zrem', KEYS[3], owner)
    leaving[owner] = tonumber(allowance)
end
leave(ARGV[2], ARGV[3])
for i = 6, #ARGV - 1, 2 do
    leave(ARGV[i], ARGV[i + 1])
end

local queue = redis.call('lrange', KEYS[2], 0, -1)
local kept = {}
local left = {}
local found = 0
local shift = 0
for i = 1, #queue do
    local waiter = queue[i]
    local allowance = leaving[waiter]
    if allowance == nil then
        kept[#kept + 1] = waiter
        if shift > 0 and redis.call('zscore', KEYS[3], waiter) ~= false then
            redis.pcall('zincrby', KEYS[3], -shift, waiter)
        end
    elseif not left[waiter] then
        left[waiter] = true
        found = found + 1
        if allowance > 0 then
            shift = shift + allowance
        end
    end
end
if found == 0 then
    return 0
end
if found <= 4 then
    for waiter in pairs(left) do
        redis.call('lrem', KEYS[2], 0, waiter)
    end
else
    -- k LREMs would cost k passes: write the line again without them (same order)
    redis.call('del', KEYS[2])
    for i = 1, #kept, 1000 do
        redis.call('rpush', KEYS[2], unpack(kept, i, math.min(i + 999, #kept)))
    end
end
if left[queue[1]] and redis.call('exists', KEYS[1]) == 0 then
    local head = first_waiter(KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[4]), server_ms(), nil)
    if head ~= false then
        redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1])
    end
end
return found
