-- lock_renew: extend the leases of many holds in one round trip (the watchdog's tick).
-- KEYS[1..n]   lock keys (one hash slot on a cluster; the caller groups them)
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the owner id whose hold on KEYS[i] is renewed
-- Returns      a list of n integers: 1 if KEYS[i] is still held by its owner (its TTL
--              extended to the lease if shorter), 0 if not (expired, released or
--              force-unlocked), -1 if KEYS[i] is not a hash any more. One bad key fails
--              only its own hold.
local renewed = {}
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
    local held = redis.pcall('hexists', KEYS[i], ARGV[i + 1])
    if type(held) == 'table' then
        renewed[i] = -1
    elseif held == 1 then
        if redis.call('pttl', KEYS[i]) < lease then
            redis.call('pexpire', KEYS[i], lease)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
