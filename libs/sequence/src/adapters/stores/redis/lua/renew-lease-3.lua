--[[
  renew-lease: extends the completion lease for the consumer that holds it.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body
  ARGV[1] now (ms), ARGV[2] consumer id, ARGV[3] lease ms, ARGV[4] key TTL margin ms

  Returns {1, settlement} when renewed, {0} when the caller does not hold a live lease (or the
  sequence is not complete, or not held). settlement: {epoch, ver, storedBytes, firstAt, dueAt,
  refund, keyTtl}.
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey, bodyKey = KEYS[1], KEYS[2], KEYS[3]
local now, consumerId = callerTime(ARGV[1]), ARGV[2]
local leaseMs, margin = tonumber(ARGV[3]), tonumber(ARGV[4])

local s = readSequence(metaKey, crcKey)
if s.state ~= 'open' or not isComplete(s) or s.leaseOwner ~= consumerId
  or not s.leaseUntil or s.leaseUntil <= now then
  return {0}
end
s.leaseUntil, s.ver = now + leaseMs, s.ver + 1
rcall('HSET', metaKey, 'leaseUntil', int(s.leaseUntil), 'ver', int(s.ver))
local ttl = sequenceTtl(s, now, leaseMs, margin)
extendSequenceTtl(metaKey, crcKey, bodyKey, ttl)
return {1, settlement(s, 0, ttl)}
