-- read_lock_renew: extend the leases of many read holds in one round trip (the watchdog's
-- tick): each hold's timeout keys, and the lock's TTL if shorter.
-- KEYS[1..n]   lock keys (one hash slot on a cluster; the caller groups them). A reader's
--              timeout keys {name}:<owner>:rwlock_timeout:k are named here (same slot).
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the reader (owner id) whose holds on KEYS[i] are renewed
-- Returns      a list of n integers: 1 if the reader still holds KEYS[i] (at least one of
--              its timeout keys alive), 0 if not, -1 if KEYS[i] is not a hash.
local renewed = {}
local lease = tonumber(ARGV[1])
for i = 1, #KEYS do
    local count = redis.pcall('hget', KEYS[i], ARGV[i + 1])
    if type(count) == 'table' then
        renewed[i] = -1
    elseif count == false or tonumber(count) == nil then
        renewed[i] = 0
    else
        local prefix
        if string.find(KEYS[i], '{', 1, true) then
            prefix = KEYS[i] .. ':' .. ARGV[i + 1] .. ':rwlock_timeout:'
        else
            prefix = '{' .. KEYS[i] .. '}:' .. ARGV[i + 1] .. ':rwlock_timeout:'
        end
        local alive = 0
        for k = 1, tonumber(count) do
            local ttl = redis.call('pttl', prefix .. k)
            if ttl ~= -2 then
                alive = alive + 1
                if ttl < lease then
                    redis.call('pexpire', prefix .. k, lease)
                end
            end
        end
        if alive > 0 then
            if redis.call('pttl', KEYS[i]) < lease then
                redis.call('pexpire', KEYS[i], lease)
            end
            renewed[i] = 1
        else
            renewed[i] = 0
        end
    end
end
return renewed
