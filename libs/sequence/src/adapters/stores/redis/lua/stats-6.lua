--[[
  stats: a consistent snapshot of the store-wide figures. Read-only.

  KEYS: see _global (open, due, first, retention, retained, totals)
  ARGV[1] now (ms)

  Returns {openSequences, bufferedBytes, oldestOpenAt | false, reservedBytes}. bufferedBytes is
  the budget held by what is stored (bodies, headers, overheads); kept fragments of failed
  sequences count until their retention ends (listExpired then releases them). reservedBytes is
  the budget held beyond that: reservations ahead of declared bytes, and grants in flight.
]]
--- @include "_clock"
--- @include "_global"

local now = callerTime(ARGV[1])
local retained = total('retained')
local over = rcall('ZRANGEBYSCORE', retentionKey, '-inf', int(now), 'LIMIT', 0, 1000)
for _, member in ipairs(over) do
  local raw = rcall('HGET', retainedKey, member)
  if raw then
    local _, bytes = parseRetained(raw)
    retained = retained - bytes
  end
end
local oldest = rcall('ZRANGE', firstKey, 0, 0, 'WITHSCORES')
local reserved = math.max(0, total('claimed') - total('stored'))
return {rcall('HLEN', openKey), int(total('stored') + retained), oldest[2] or false, int(reserved)}
