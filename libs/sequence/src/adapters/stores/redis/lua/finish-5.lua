--[[
  finish: ends a sequence, unless it finished already (live marker) or another consumer holds
  its completion lease (a stale holder never overwrites the outcome). 'completed' and
  'rejected' drop its fragments; 'failed' keeps them (and the meta, state 'failed') until
  now + retention. All write the finished marker, which also carries the budget fence (the
  sequence's epoch) until it expires.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body, KEYS[4] done, KEYS[5] fence
  ARGV[1] outcome, ARGV[2] now (ms), ARGV[3] retention ms, ARGV[4] reason, or '',
  ARGV[5] key TTL margin ms, ARGV[6] consumer id

  A call that finds the live marker it wrote itself (the same consumer id and outcome: its reply
  was lost and the client sent it again) answers what it answered then, from the marker.

  Returns {0} when refused, else {1, forgetEpoch, retainedBytes, retainUntil, releasedUntil,
  markerTtl}:
    forgetEpoch    epoch of the open sequence's budget record, 0 when none was open
    retainedBytes  bytes kept for inspection ('failed'), counted until retainUntil
    releasedUntil  retainUntil of fragments an earlier 'failed' kept and this call dropped, or 0
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey, bodyKey, doneKey, fenceKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local outcome, now, retentionMs = ARGV[1], callerTime(ARGV[2]), tonumber(ARGV[3])
local reason = ARGV[4] ~= '' and ARGV[4] or nil
local margin, consumerId = tonumber(ARGV[5]), ARGV[6]
local untilAt = now + retentionMs

local marker = rcall('HMGET', doneKey, 'until', 'outcome', 'by', 'reply')
local markerUntil = tonumber(marker[1])
if markerUntil and markerUntil > now then
  if marker[2] == outcome and marker[3] == consumerId and marker[4] then
    local again = {1}
    for value in string.gmatch(marker[4], '[^:]+') do
      again[#again + 1] = tonumber(value)
    end
    again[#again + 1] = rcall('PTTL', doneKey)
    return again
  end
  return {0}
end
local s = readSequence(metaKey, crcKey)
if s.state == 'open' and s.leaseOwner and s.leaseOwner ~= consumerId then
  return {0}
end
local forgetEpoch, retainedBytes, releasedUntil = 0, 0, 0
if s.state == 'failed' then
  releasedUntil = s.retainUntil or 0
  dropSequence(metaKey, crcKey, bodyKey)
elseif s.state == 'open' then
  forgetEpoch = s.epoch
  if outcome == 'failed' then
    retainedBytes = storedCharge(s)
    rcall('HSET', metaKey, 'state', 'failed', 'retainUntil', int(untilAt))
    local ttl = math.max(untilAt - now, 0) + margin
    setSequenceTtl(metaKey, crcKey, bodyKey, ttl)
  else
    dropSequence(metaKey, crcKey, bodyKey)
  end
end
local markerTtl = writeMarker(doneKey, fenceKey, outcome, reason, untilAt, s.epoch, now, margin)
local reply = {int(forgetEpoch), int(retainedBytes),
  int(outcome == 'failed' and forgetEpoch > 0 and untilAt or 0), int(releasedUntil)}
rcall('HSET', doneKey, 'by', consumerId, 'reply', table.concat(reply, ':'))
return {1, reply[1], reply[2], reply[3], reply[4], int(markerTtl)}
