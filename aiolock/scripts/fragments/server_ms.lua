-- fragment server_ms: the server's clock.
-- Expects  nothing.
-- Defines  server_ms(): Unix milliseconds on the server's clock (TIME), so that the clocks of
--          the clients do not matter. A script may call TIME and write afterwards because it
--          is replicated by its effects: the default of Redis 5 to 6.2, the only mode of
--          Redis 7 and Valkey; the call below asks for it on a Redis 6.2 configured with
--          `lua-replicate-commands no` (include this fragment before the script's first write).
redis.replicate_commands()
local function server_ms()
    local time = redis.call('time')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
