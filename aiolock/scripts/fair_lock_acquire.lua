-- fair_lock_acquire: take, re-enter or wait in line for a fair lock (Redisson's RFairLock).
-- KEYS[1]  the lock key: a hash, field = owner id, value = hold count; TTL = lease
-- KEYS[2]  redisson_lock_queue:{name}: the owners waiting, first in line first
-- KEYS[3]  redisson_lock_timeout:{name}: zset owner -> deadline, Unix ms (callers' clocks)
-- KEYS[4]  redisson_lock__channel:{name}: waiter W listens on KEYS[4] .. ':' .. W
-- KEYS[5]  aiolock_lock_alive:{name}: zset owner -> Unix ms on the server's clock until
--          which that aiolock waiter is presumed alive (its heartbeat)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- ARGV[3]  wait allowance in ms (0: try once, never wait in line)
-- ARGV[4]  now: Unix ms on the caller's clock
-- ARGV[5]  the message that wakes a waiter, "0"
-- ARGV[6]  the publish command (PUBLISH, or SPUBLISH for sharded pub/sub)
-- Returns  nil when acquired, else the ms (>= 1) after which to try again: the holder's
--          remaining lease, or while the lock is free for the first in line, until it is
--          presumed gone; a waiter in line at most a quarter of its allowance (its heartbeat).
--
-- First come, first served: the lock is taken only when it is free and the caller is first
-- in line (or nobody waits); a waiter joins the tail once. Deadlines are Redisson's: a
-- waiter's is its allowance past the one ahead of it, the first one's its allowance past the
-- end of the holder's lease; Redisson moves every deadline up by the allowance of a waiter
-- that takes the lock; this script moves them by however the end of the lease moves
-- (taking, re-entering), and the first in line keeps its own deadline (and everyone's behind
-- it) its allowance past the current lease end each time it checks, so a live waiter is
-- never dropped by a deadline (Redisson's scripts purge by them too).
-- Each check of an aiolock waiter also sets its heartbeat, its allowance from now on the
-- server's clock; it checks again within a quarter of that. A waiter whose heartbeat ran out
-- is presumed dead wherever it stands in line (fair_line.lua), so dead waiters ahead keep a
-- free lock from a live one for one allowance at most, however many they are and whatever
-- the holder did (a Redisson holder's early release moves no deadline). The heartbeats' key
-- outlives the last deadline in line by the checker's allowance (its TTL, set here and moved
-- with the deadlines), so the heartbeats of waiters that all stopped at once stay to tell
-- them dead: they never pass for Redisson waiters (fair_line.lua, "The heartbeats' key").
-- Under OOM an owner already in line keeps its place (its first write is a ZREM, after which
-- Redis lets a script grow memory); joining the line, like taking the lock, is refused.
--@include server_ms
--@include fair_line
local lease = tonumber(ARGV[1])
local owner = ARGV[2]
local allowance = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local clock = server_ms()

local head, dropped = first_waiter(KEYS[2], KEYS[3], KEYS[5], now, clock, owner)

local pttl = redis.call('pttl', KEYS[1])
if pttl == -2 then
    if head == false or head == owner then
        if head == owner then
            local mine = tonumber(redis.call('zscore', KEYS[3], owner))
            redis.call('lpop', KEYS[2])
            redis.call('zrem', KEYS[3], owner)
            if mine ~= nil then
                -- the ones behind now wait for this lease instead of for this waiter's turn
                shift_deadlines(KEYS[3], KEYS[5], now + lease - mine)
            end
        else
            redis.call('zrem', KEYS[3], owner)
        end
        redis.call('zrem', KEYS[5], owner)
        redis.call('hset', KEYS[1], owner, 1)
        redis.call('pexpire', KEYS[1], lease)
        return nil
    end
    if dropped then
        -- the lock is free and the new first in line may not know: wake it
        redis.call(ARGV[6], KEYS[4] .. ':' .. head, ARGV[5])
    end
elseif redis.call('hexists', KEYS[1], owner) == 1 then
    redis.call('hincrby', KEYS[1], owner, 1)
    if pttl < lease then
        redis.call('pexpire', KEYS[1], lease)
        if pttl >= 0 then
            shift_deadlines(KEYS[3], KEYS[5], lease - pttl)
        end
    end
    return nil
end

-- when the holder's lease ends as seen now (a key without a TTL: as if it ended in a lease)
local lease_end = now + pttl
local retry = pttl
if pttl == -1 then
    lease_end = now + lease
    retry = lease
elseif pttl == -2 then
    lease_end = now
    retry = gone_in(KEYS[3], KEYS[5], head, now, clock)
end
if allowance <= 0 then
    return math.max(retry, 1)
end

local mine = tonumber(redis.call('zscore', KEYS[3], owner))
if mine == nil then
    local after = lease_end
    local last = redis.call('lindex', KEYS[2], -1)
    if last ~= false and last ~= owner then
        local deadline = tonumber(redis.call('zscore', KEYS[3], last))
        if deadline ~= nil and deadline > after then
            after = deadline
        end
    end
    redis.call('zadd', KEYS[3], after + allowance, owner)
    if last ~= owner then
        redis.call('rpush', KEYS[2], owner)
    end
    if head == false then
        head = owner
    end
else
    redis.call('zrem', KEYS[5], owner)
    if head == owner and mine < lease_end + allowance then
        shift_deadlines(KEYS[3], KEYS[5], lease_end + allowance - mine)
    end
end
redis.call('zadd', KEYS[5], clock + allowance, owner)
keep_beats(KEYS[3], KEYS[5], now, allowance)
local beat = math.max(1, math.floor(allowance / 4))
if retry > beat then
    retry = beat
end
if retry < 1 then
    retry = 1
end
return retry
