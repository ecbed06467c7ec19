--[[
  forget: the global step that follows the end of a sequence (finish, expire, a limit) or the
  fencing of a dead epoch: removes the sequence's budget record if it is still of that epoch,
  and records the fragments a 'failed' finish keeps.

  KEYS: see _global (open, due, first, retention, retained, totals)
  ARGV[1] member, ARGV[2] epoch (0: none), ARGV[3] retainUntil (0: nothing kept),
  ARGV[4] retained bytes, ARGV[5] TTL (ms)

  Returns 1 when a record was removed, 0 otherwise.
]]
--- @include "_global"

dropOrphanedTotals()

local member, epoch = ARGV[1], tonumber(ARGV[2])
local retainUntil, retainedBytes, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local removed = 0
local record = readRecord(member)
if record and epoch > 0 and record.epoch == epoch then
  dropRecord(member, record)
  removed = 1
end
if retainUntil > 0 then
  local previous = rcall('HGET', retainedKey, member)
  if previous then
    local _, previousBytes = parseRetained(previous)
    addTotal('retained', -previousBytes)
  end
  rcall('HSET', retainedKey, member, int(retainUntil) .. ':' .. int(retainedBytes))
  rcall('ZADD', retentionKey, int(retainUntil), member)
  addTotal('retained', retainedBytes)
end
extendAll(ttl)
return removed
