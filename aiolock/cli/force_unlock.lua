-- aiolock unlock --force: delete a lock whoever holds it, and wake whoever waits for it; but
-- only if its holders are still exactly the ones the operator was shown (compare and delete).
-- Redisson's forceUnlock for every lock type of its layout (the CLI's own script: the
-- library's are in aiolock/scripts). Every key is in the slot of N.
-- KEYS[1]  the lock's hash N
-- KEYS[2]  redisson_lock__channel:{N}  (a fair lock's waiter W listens on KEYS[2] .. ':' .. W)
-- KEYS[3]  redisson_rwlock:{N}
-- KEYS[4]  redisson_lock_queue:{N}     (a fair lock's waiters, first in line first)
-- KEYS[5]  redisson_lock_timeout:{N}   (a fair lock's waiters' deadlines, Unix ms)
-- KEYS[6]  aiolock_lock_alive:{N}      (aiolock fair waiters' heartbeats, server Unix ms)
-- ARGV[1]  now, Unix ms
-- ARGV[2..] the hash fields the operator was shown (owner ids, ":write" for a writer; not
--          "mode"), in any order
-- Returns  -1 the holders are not exactly ARGV[2..] any more (nothing done: another holder,
--          one more or one less, or no lock hash at N); 1 lock deleted, "0" published on
--          KEYS[2]; 2 read-write lock deleted, "1" (wake all) published on KEYS[3]; 3 fair
--          lock deleted, "0" published to the first waiter not presumed gone
--          (the ones before it are dropped from the queue, as the fair lock's own unlock does).
-- A fenced lock's token counter is kept: tokens must keep growing after a forced unlock.
--@include server_ms
--@include fair_line
if redis.call('type', KEYS[1]).ok ~= 'hash' then
    return -1
end
local shown = {}
for i = 2, #ARGV do
    shown[ARGV[i]] = true
end
local holders = 0
for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    if field ~= 'mode' then
        if not shown[field] then
            return -1
        end
        holders = holders + 1
    end
end
if holders ~= #ARGV - 1 then
    return -1
end
local mode = redis.call('hget', KEYS[1], 'mode')
redis.call('del', KEYS[1])
if mode then
    redis.call('publish', KEYS[3], '1')
    return 2
end
local head = first_waiter(KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[1]), server_ms(), nil)
if head then
    redis.call('publish', KEYS[2] .. ':' .. head, '0')
    return 3
end
redis.call('publish', KEYS[2], '0')
return 1
