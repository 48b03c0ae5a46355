-- lock_renew: extend the leases of many holds in one round trip (the watchdog's tick).
-- KEYS[1..n]  lock keys (one hash slot on a cluster; the caller groups them)
-- ARGV[1]     lease in milliseconds
-- ARGV[2..n+1] the owner id whose hold on KEYS[i] is renewed
-- Returns     a list of n integers: 1 if KEYS[i] is still held by its owner (TTL reset to
--             the lease), 0 if not (the hold is gone: expired, released or force-unlocked).
local renewed = {}
for i = 1, #KEYS do
    if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
        redis.call('pexpire', KEYS[i], ARGV[1])
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
