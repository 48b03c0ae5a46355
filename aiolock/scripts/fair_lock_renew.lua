-- fair_lock_renew: extend the leases of many fair-lock holds in one round trip (the
-- watchdog's tick), moving each lock's waiters' deadlines back by as much.
-- KEYS[1..n]   lock keys (one hash slot on a cluster; the caller groups them). Each lock's
--              deadlines, redisson_lock_timeout:{name}, and its waiters' heartbeats,
--              aiolock_lock_alive:{name}, are named here (same slot): a renewal moves both
--              later by as much as the lease (fragments/fair_line.lua).
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the owner id whose hold on KEYS[i] is renewed
-- Returns      a list of n integers: 1 if KEYS[i] is still held by its owner (its TTL
--              extended to the lease if shorter), 0 if not, -1 if KEYS[i] is not a hash.
--@include fair_line
local renewed = {}
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
    local held = redis.pcall('hexists', KEYS[i], ARGV[i + 1])
    if type(held) == 'table' then
        renewed[i] = -1
    elseif held == 1 then
        local pttl = redis.call('pttl', KEYS[i])
        if pttl < lease then
            redis.call('pexpire', KEYS[i], lease)
            if pttl >= 0 then
                local tagged = KEYS[i]
                if not string.find(tagged, '{', 1, true) then
                    tagged = '{' .. tagged .. '}'
                end
                shift_deadlines(
                    'redisson_lock_timeout:' .. tagged,
                    'aiolock_lock_alive:' .. tagged,
                    lease - pttl
                )
            end
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
