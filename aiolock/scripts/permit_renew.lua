-- permit_renew: extend the leases of many permits in one round trip (the watchdog's tick),
-- returning every expired permit of their semaphores to the pool on the way.
-- KEYS[1..n]   semaphore keys (one hash slot on a cluster; the caller groups them)
-- ARGV[1]      lease in milliseconds
-- ARGV[i+1]    the id of the permit of KEYS[i] to renew, as 32 hex digits
-- Returns      a list of n integers: 1 if the permit is still held (its expiry moved to the
--              server's clock now + lease), 0 if not (expired, released, or its semaphore
--              deleted), -1 if the semaphore's keys have the wrong type. One bad key fails
--              only its own permits.
-- Each semaphore's side keys are named from its key as Redisson names them (same slot):
-- {name}:timeout and redisson_sc:{name}, or name:timeout and redisson_sc:name when the name
-- has a hash tag of its own. The watchdog's calls carry no publish command: PUBLISH.
local lease = tonumber(ARGV[1])
local now = redis.call('time')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
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
    local score = redis.pcall('zscore', timeouts, id)
    if type(score) == 'table' then
        renewed[i] = -1
    elseif score then
        redis.call('zadd', timeouts, now + lease, id)
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
