-- write_lock_renew: extend the leases of many write holds of read-write locks in one round
-- trip (the watchdog's tick).
-- KEYS[1..n]   lock keys (one hash slot on a cluster; the caller groups them)
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the writer of KEYS[i]: its hash field is this id, with ":write" appended if
--              it does not end so already (an owner id replaced after a request that could
--              not be fenced is a plain owner id)
-- Returns      a list of n integers: 1 if KEYS[i] is still written by it (its TTL extended
--              to the lease if shorter), 0 if not, -1 if KEYS[i] is not a hash.
local renewed = {}
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
    local writer = ARGV[i + 1]
    if string.sub(writer, -6) ~= ':write' then
        writer = writer .. ':write'
    end
    local held = redis.pcall('hexists', KEYS[i], writer)
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
