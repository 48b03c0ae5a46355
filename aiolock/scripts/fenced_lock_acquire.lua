-- fenced_lock_acquire: take or re-enter a reentrant lock and return its fencing token.
-- KEYS[1]  the lock key (hash: owner id -> hold count; TTL = lease)
-- KEYS[2]  the token counter, redisson_lock_token:{name} (no TTL, only grows)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- Returns  {1, token} when acquired: a first hold takes INCR of the counter and sets the TTL,
--          a reentrant hold gets the current value and only extends the TTL;
--          otherwise {0, the holder's remaining TTL in ms}.
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, redis.call('incr', KEYS[2])}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}
