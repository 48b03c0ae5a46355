-- fragment server_ms: the server's clock.
-- Expects  nothing.
-- Defines  server_ms(): Unix milliseconds on the server's clock (TIME), so that the clocks of
--          the clients do not matter. A script may call TIME and write afterwards (Redis >= 5
--          replicates a script by its effects).
local function server_ms()
    local time = redis.call('time')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
