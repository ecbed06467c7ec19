--[[
  settle: the global step that follows a change of one sequence. Applies what the sequence's
  script reported (stored bytes, first fragment time, due time) unless a later change was
  settled already, and gives back the part of a grant the sequence did not use.

  KEYS: see _global (open, due, first, retention, retained, totals)
  ARGV[1] member, ARGV[2] epoch, ARGV[3] ver, ARGV[4] storedBytes, ARGV[5] firstAt,
  ARGV[6] dueAt, ARGV[7] refund, ARGV[8] TTL (ms)

  Returns 1 when applied; 0 when the record is gone, of another epoch, or already newer.
]]
--- @include "_global"

dropOrphanedTotals()

local member, epoch, ver = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stored, firstAt, due = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local refund, ttl = tonumber(ARGV[7]), tonumber(ARGV[8])

local record = readRecord(member)
if not record or record.epoch ~= epoch or ver < record.ver then
  return 0
end
-- A refund counts once: only with the change that produced it (a replay has the same ver).
if ver > record.ver and refund > 0 then
  local back = math.min(refund, record.claim)
  record.claim = record.claim - back
  addClaim(member, -back)
end
addTotal('stored', stored - record.stored)
record.stored, record.ver = stored, ver
writeRecord(member, record)
rcall('ZADD', dueKey, int(due), member)
rcall('ZADD', firstKey, int(firstAt), member)
extendAll(ttl)
return 1
