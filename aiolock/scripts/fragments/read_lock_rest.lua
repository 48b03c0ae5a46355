-- fragment read_lock_rest: what is left of a read-write lock once an owner's read holds are
-- gone (the end of read_lock_release and read_lock_purge).
-- Expects  the keys as arguments: `lock`, the lock hash (see read_lock_acquire.lua);
--          `prefix`, the prefix of every reader's timeout keys, {name} (a read hold's key is
--          <prefix>:<owner>:rwlock_timeout:<k>); `channel`, redisson_rwlock:{name}; and the
--          `message` and `publish` command a freed lock is announced with.
-- Defines  read_lock_rest(lock, prefix, channel, message, publish): true if the lock is still
--          held: by the writer (who also read), or by readers, the lock's TTL then being the
--          longest of their read holds'; else it deletes the lock, publishes `message` on
--          `channel` and returns false. Timeout keys of other readers are named here, not in
--          KEYS (Redisson's script does the same; they share the lock's hash slot). Only
--          reads, PEXPIRE, DEL and PUBLISH: runs on a server out of memory.
local function read_lock_rest(lock, prefix, channel, message, publish)
    if redis.call('hlen', lock) > 1 then
        if redis.call('hget', lock, 'mode') == 'write' then
            return true
        end
        local longest = -3
        local fields = redis.call('hkeys', lock)
        for _, field in ipairs(fields) do
            local holds = tonumber(redis.call('hget', lock, field))
            if holds ~= nil then
                for i = holds, 1, -1 do
                    local ttl = redis.call('pttl', prefix .. ':' .. field .. ':rwlock_timeout:' .. i)
                    if ttl > longest then
                        longest = ttl
                    end
                end
            end
        end
        if longest > 0 then
            redis.call('pexpire', lock, longest)
            return true
        end
    end
    redis.call('del', lock)
    redis.call(publish, channel, message)
    return false
end
