-- latch_count_down: count a countdown latch down by one; at zero it opens.
-- KEYS[1]  the latch: a string holding the count (absent: open)
-- KEYS[2]  the client's request latches on it (see latch_try_set.lua)
-- ARGV[1]  how long the request latches are kept after the client's last write, ms
-- ARGV[2]  the publish command
-- ARGV[3]  the latch's channel (an argument, see latch_try_set.lua)
-- ARGV[4]  request id
-- ARGV[5..] ids of earlier requests whose replies arrived: their latches are forgotten
-- Returns  the new count: at 0 the key is deleted and 0 ("open") is published; -1 if the
--          latch was open already (nothing changed: it is never counted below zero). A
--          request that already ran returns what it returned then (never counts twice).
-- The first write is an HDEL, which needs no memory: a server out of memory then lets the
-- whole script run.
local done = redis.call('hget', KEYS[2], ARGV[4])
if done then
    return tonumber(done)
end
redis.call('hdel', KEYS[2], unpack(ARGV, 4))
local result = -1
local count = redis.call('get', KEYS[1])
if count ~= false then
    count = tonumber(count)
    if count == nil then
        return redis.error_reply('ERR the latch count is not an integer')
    end
    if count > 0 then
        result = redis.call('decr', KEYS[1])
        if result <= 0 then
            redis.call('del', KEYS[1])
            redis.call(ARGV[2], ARGV[3], 0)
            result = 0
        end
    end
end
-- recorded whatever it did, -1 too: a count-down that found the latch open and whose
-- reply was lost must not be sent again (it would count down a latch closed since)
redis.call('hset', KEYS[2], ARGV[4], result)
redis.call('pexpire', KEYS[2], ARGV[1])
return result
