-- fair_lock_purge: remove every count an owner has on a fair lock (cleaning up a lost or
-- abandoned hold); if that frees the lock, wake the first waiter in line.
-- KEYS[1]  the lock key (hash: owner id -> hold count)
-- KEYS[2]  redisson_lock_queue:{name}
-- KEYS[3]  redisson_lock_timeout:{name}
-- KEYS[4]  redisson_lock__channel:{name} (waiter W listens on KEYS[4] .. ':' .. W)
-- ARGV[1]  the unlock message, "0"
-- ARGV[2]  owner id
-- ARGV[3]  now: Unix ms on the caller's clock
-- ARGV[4]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  0 if the owner held nothing; 1 if its counts were removed and others still hold
--          the lock; 2 if that freed the lock (the first waiter woken).
-- HDEL comes first, then only deletions and PUBLISH (moving the deadlines is skipped on a
-- server out of memory), so it goes through under OOM.
local pttl = redis.call('pttl', KEYS[1])
if redis.call('hdel', KEYS[1], ARGV[2]) == 0 then
    return 0
end
if redis.call('exists', KEYS[1]) == 1 then
    return 1
end
local now = tonumber(ARGV[3])
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
if pttl > 0 then
    local waiting = redis.call('zrange', KEYS[3], 0, -1)
    for i = 1, #waiting do
        redis.pcall('zincrby', KEYS[3], -pttl, waiting[i])
    end
end
if head ~= false then
    redis.call(ARGV[4], KEYS[4] .. ':' .. head, ARGV[1])
end
return 2
