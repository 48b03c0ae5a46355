-- fair_lock_release: drop one hold of a fair lock; the last one frees it and wakes the first
-- waiter in line (only that one).
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- KEYS[5]  aiolock_lock_alive:{name} (zset owner -> heartbeat, server Unix ms)
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  lease in milliseconds: while holds remain the TTL is extended to it if shorter
-- ARGV[3]  owner id
-- ARGV[4]  now: Unix ms on the caller's clock
-- ARGV[5]  the owner's count the caller expects (compare and decrement: a release that
--          arrives late, or twice, finds another count and changes nothing)
-- ARGV[6]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  nil if the owner holds no count (if the lock is free, the first waiter is woken
--          anyway); -1 if it holds another count than expected (nothing changed); 0 if holds
--          remain (count -1); 1 if this was the last hold.
-- Waiters' deadlines move with the end of the lease (see fair_lock_acquire.lua): back when a
-- hold extends it, forward by what was left of it when the lock is freed. The last release
-- deletes the key before anything that needs memory, so it goes through on a server out of
-- memory (moving the deadlines is then skipped).
--@include server_ms
--@include fair_line
local head = first_waiter(KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[4]), server_ms(), nil)

local count = tonumber(redis.call('hget', KEYS[1], ARGV[3]))
if count == nil then
    if head ~= false and redis.call('exists', KEYS[1]) == 0 then
        redis.call(ARGV[6], KEYS[4] .. ':' .. head, ARGV[1])
    end
    return nil
end
if count ~= tonumber(ARGV[5]) then
    return -1
end
local pttl = redis.call('pttl', KEYS[1])
if count > 1 then
    local lease = tonumber(ARGV[2])
    -- PEXPIRE first: a write that needs no memory, after which a server out of memory
    -- lets the script's HINCRBY through (Redis refuses only a script's first write)
    redis.call('pexpire', KEYS[1], math.max(pttl, lease))
    redis.call('hincrby', KEYS[1], ARGV[3], -1)
    if pttl >= 0 and pttl < lease then
        shift_deadlines(KEYS[3], KEYS[5], lease - pttl)
    end
    return 0
end
if redis.call('hlen', KEYS[1]) > 1 then
    redis.call('hdel', KEYS[1], ARGV[3])
    return 1
end
redis.call('del', KEYS[1])
if pttl > 0 then
    shift_deadlines(KEYS[3], KEYS[5], -pttl)
end
if head ~= false then
    redis.call(ARGV[6], KEYS[4] .. ':' .. head, ARGV[1])
end
return 1
