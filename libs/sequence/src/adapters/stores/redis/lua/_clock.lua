--[[
  The clock of leases and deadlines (textually included by the script loader; see "Clocks" in
  docs/configuration.md). The stores send each time a caller gives them (now, a deadline) as
  "<time>:<clock>": the time, and the reading of the caller's clock as the call left. When that
  clock is within CLOCK_TOLERANCE_MS of Redis's (TIME), the time is taken as it is; when it is
  further off, the time is moved by the difference, onto Redis's clock. A machine whose clock
  runs ahead thus takes no lease early and expires nothing early, and a caller that passes a
  `now` of its own choosing (a test fast-forwarding) still gets exactly that `now`. A plain number
  (a script run by hand) is taken as it is.
]]
local CLOCK_TOLERANCE_MS = 1000
local redisClockMs

local function callerTime(arg)
  local at, clock = string.match(arg, '^([^:]+):([^:]+)$')
  if not at then
    return tonumber(arg)
  end
  if not redisClockMs then
    local time = redis.call('TIME')
    redisClockMs = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  local skew = redisClockMs - math.floor(tonumber(clock))
  if math.abs(skew) <= CLOCK_TOLERANCE_MS then
    return tonumber(at)
  end
  return tonumber(at) + skew
end
