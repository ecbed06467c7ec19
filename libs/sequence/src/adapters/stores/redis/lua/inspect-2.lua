--[[
  inspect: one open sequence as the operator console shows it. Read-only.

  KEYS[1] meta, KEYS[2] crc
  ARGV[1] now (ms)

  Returns false when the sequence is not open (finished, expired, failed, or never seen);
  otherwise {size | false, declaredBytes | false, storedBytes, firstAt, lastAt, deadline,
  complete (0|1), leaseOwner | false, positions}: leaseOwner only while the lease is live,
  positions the stored ones, unordered.
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey = KEYS[1], KEYS[2]
local now = callerTime(ARGV[1])

local s = readSequence(metaKey, crcKey)
if s.state ~= 'open' then
  return false
end
local leaseOwner = false
if s.leaseOwner and s.leaseUntil and s.leaseUntil > now then
  leaseOwner = s.leaseOwner
end
return {s.size and int(s.size) or false, s.declaredBytes and int(s.declaredBytes) or false,
  int(s.storedBytes), int(s.firstAt), int(s.lastAt), int(s.deadline),
  isComplete(s) and 1 or 0, leaseOwner, rcall('HKEYS', crcKey)}
