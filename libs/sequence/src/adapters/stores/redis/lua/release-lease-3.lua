--[[
  release-lease: the holder gives the completion lease up (until = min(until, now)), so that a
  redelivered fragment can take the sequence over at once. No-op for anyone else.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body
  ARGV[1] now (ms), ARGV[2] consumer id, ARGV[3] key TTL margin ms

  Returns {1, settlement} when released, {0} otherwise. settlement: {epoch, ver, storedBytes,
  firstAt, dueAt, refund, keyTtl}.
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey, bodyKey = KEYS[1], KEYS[2], KEYS[3]
local now, consumerId, margin = callerTime(ARGV[1]), ARGV[2], tonumber(ARGV[3])

local s = readSequence(metaKey, crcKey)
if s.state ~= 'open' or s.leaseOwner ~= consumerId or not s.leaseUntil then
  return {0}
end
s.leaseUntil, s.ver = math.min(s.leaseUntil, now), s.ver + 1
rcall('HSET', metaKey, 'leaseUntil', int(s.leaseUntil), 'ver', int(s.ver))
-- Key TTLs only ever grow: the one set when the lease was taken still covers the new due time.
return {1, settlement(s, 0, sequenceTtl(s, now, 0, margin))}
