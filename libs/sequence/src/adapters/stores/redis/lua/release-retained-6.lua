--[[
  release-retained: the global step after drop-retained: stops counting a failed sequence's kept
  fragments, if the index still holds that retention (same until).

  KEYS: see _global (open, due, first, retention, retained, totals)
  ARGV[1] member, ARGV[2] retainUntil

  Returns 1 when released, 0 otherwise.
]]
--- @include "_global"

dropOrphanedTotals()

local member, expectedUntil = ARGV[1], tonumber(ARGV[2])
local raw = rcall('HGET', retainedKey, member)
if not raw then
  return 0
end
local untilAt, bytes = parseRetained(raw)
if untilAt ~= expectedUntil then
  return 0
end
rcall('HDEL', retainedKey, member)
rcall('ZREM', retentionKey, member)
addTotal('retained', -bytes)
return 1
