-- permit_renew: extend the leases of many permits in one round trip (the watchdog's tick),
-- returning every expired permit of their semaphores to the pool on the way.
-- KEYS[1..n]   semaphore keys (one hash slot on a cluster; the caller groups them)
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the id of the permit of KEYS[i] to renew, as 32 hex digits
-- Returns      a list of n integers: 1 if the permit is still held (its expiry moved to the
--              server's clock now + lease), 0 if not (expired, released, or its semaphore
--              deleted), -1 if the semaphore's keys have the wrong type. One bad key fails
--              only its own permits. Runs on a server out of memory (see below).
-- Each semaphore's side keys are named from its key as Redisson names them (same slot):
-- {name}:timeout and redisson_sc:{name}, or name:timeout and redisson_sc:name when the name
-- has a hash tag of its own. The watchdog's calls carry no publish command: PUBLISH.
local lease = tonumber(ARGV[1])
--@include server_ms
local now = server_ms()
local swept = {}
local renewed = {}
for i = 1, #KEYS do
    local name = KEYS[i]
    local tag = name
    if not string.find(name, '{', 1, true) then
        tag = '{' .. name .. '}'
    end
    local timeouts = tag .. ':timeout'
    if swept[name] == nil then
        swept[name] = true
        local expired = redis.pcall('zrangebyscore', timeouts, '-inf', now, 'limit', 0, 100)
        if type(expired) == 'table' and expired.err == nil and #expired > 0 then
            redis.call('zrem', timeouts, unpack(expired))
            local available = redis.pcall('incrby', name, #expired)
            if type(available) == 'number' and available > 0 then
                redis.call('publish', 'redisson_sc:' .. tag, available)
            end
        end
    end
    local id = string.gsub(ARGV[i + 1], '%x%x', function(hex)
        return string.char(tonumber(hex, 16))
    end)
    -- ZREM, then ZADD: Redis refuses a command that needs memory on a server out of memory
    -- only as a script's first write, so the removal (which needs none) goes first, as the
    -- lock's renewal starts with PEXPIRE: permits stay renewed under OOM as locks do. (A
    -- set that the removal emptied is made anew: its TTL, if any, is set again.)
    local ttl = redis.pcall('pttl', timeouts)
    local held = redis.pcall('zrem', timeouts, id)
    if type(held) == 'table' then
        renewed[i] = -1
    elseif held == 1 then
        redis.call('zadd', timeouts, now + lease, id)
        if ttl > 0 then
            redis.call('pexpire', timeouts, ttl)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
