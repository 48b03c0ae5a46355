-- fragment fair_line: a fair lock's line of waiters (Redisson's RFairLock layout, plus the
-- heartbeats of aiolock's waiters).
-- Expects  the keys as arguments: `line`, redisson_lock_queue:{name} (list of owners, first
--          in line first); `deadlines`, redisson_lock_timeout:{name} (zset owner -> Unix ms on
--          the clock of the client that wrote it, Redisson's); `alive`,
--          aiolock_lock_alive:{name} (zset owner -> Unix ms on the server's clock: until when
--          that aiolock waiter is presumed alive; Redisson's waiters have none). `now`: the
--          caller's clock, `clock`: the server's (server_ms()), both in Unix ms.
-- Defines  first_waiter(line, deadlines, alive, now, clock, keep): drops from the head of the
--          line every waiter presumed gone, and returns the first one left (false if none)
--          and whether any was dropped. A waiter is presumed gone when its deadline has passed
--          (Redisson's rule, which Redisson's scripts apply too) or when it is an aiolock
--          waiter whose heartbeat ran out (its allowance after its last check: a live one
--          checks four times as often), wherever it was in line: so dead waiters ahead keep a
--          free lock one allowance at most, however many. `keep` (the caller) is never
--          dropped. Only LPOP and ZREM: runs on a server out of memory.
--          gone_in(deadlines, alive, waiter, now, clock): ms until `waiter` (one first_waiter
--          kept) is presumed gone.
--          keep_beats(deadlines, alive, now, slack): makes `alive` outlive every deadline in
--          line by `slack` ms at least (its TTL; see "The heartbeats' key" below).
--          shift_deadlines(deadlines, alive, delta): moves every deadline by `delta` ms, and
--          when later, `alive`'s expiry as much (skipped on a server out of memory before the
--          script's first write: ZINCRBY needs memory).
-- The heartbeats' key. An aiolock waiter is told from a Redisson one by having a heartbeat,
-- so `alive` must not vanish while a waiter it names may still stand in line: a waiter stays
-- in line until its deadline at most (Redisson's scripts drop it then, aiolock's sooner), so
-- each check of a waiter sets `alive`'s TTL to at least the last deadline in line plus that
-- waiter's allowance (keep_beats), and every move of the deadlines later (a lease extended
-- or renewed, the first in line keeping its place) moves that expiry later as much
-- (shift_deadlines; Redisson's scripts only ever move deadlines sooner). When every aiolock
-- waiter stops checking at once (a process killed or cut off, give-ups lost), their
-- heartbeats run out but stay, and they are dropped together one allowance after their
-- last checks, however many (if the key expired with them, they would pass for Redisson
-- waiters and be dropped one chained deadline, one allowance, at a time). Every aiolock
-- waiter leaving the line removes its heartbeat, so the key empties, and Redis deletes it,
-- with the line; a heartbeat left by a waiter that Redisson's scripts dropped goes with the
-- key's TTL, one allowance after the last deadline.
local function first_waiter(line, deadlines, alive, now, clock, keep)
    local dropped = false
    while true do
        local head = redis.call('lindex', line, 0)
        if head == false or head == keep then
            return head, dropped
        end
        local deadline = tonumber(redis.call('zscore', deadlines, head))
        if deadline ~= nil and deadline > now then
            local beat = tonumber(redis.call('zscore', alive, head))
            if beat == nil or beat > clock then
                return head, dropped
            end
        end
        redis.call('lpop', line)
        redis.call('zrem', deadlines, head)
        redis.call('zrem', alive, head)
        dropped = true
    end
end

local function gone_in(deadlines, alive, waiter, now, clock)
    local wait = tonumber(redis.call('zscore', deadlines, waiter)) - now
    local beat = tonumber(redis.call('zscore', alive, waiter))
    if beat ~= nil and beat - clock < wait then
        wait = beat - clock
    end
    return wait
end

local function keep_beats(deadlines, alive, now, slack)
    local keep = slack
    local last = redis.call('zrange', deadlines, -1, -1, 'withscores')
    if last[2] ~= nil and tonumber(last[2]) - now + slack > keep then
        keep = tonumber(last[2]) - now + slack
    end
    if redis.call('pttl', alive) < keep then
        redis.call('pexpire', alive, keep)
    end
end

local function shift_deadlines(deadlines, alive, delta)
    if delta ~= 0 then
        local waiting = redis.call('zrange', deadlines, 0, -1)
        for i = 1, #waiting do
            redis.pcall('zincrby', deadlines, delta, waiting[i])
        end
        if delta > 0 then
            local ttl = redis.call('pttl', alive)
            if ttl > 0 then
                redis.pcall('pexpire', alive, ttl + delta)
            end
        end
    end
end
