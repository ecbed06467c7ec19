--[[
  reserve: the global step that precedes storing a fragment. Grants `increase` more budget bytes
  to the sequence's record, creating the record (a new epoch, counted as an open sequence, with
  a provisional due time) when there is none; or answers back-pressure.

  KEYS: see _global (open, due, first, retention, retained, totals)
  ARGV[1] member, ARGV[2] increase, ARGV[3] now (ms), ARGV[4] provisional due time (ms),
  ARGV[5] maxOpenSequences, ARGV[6] maxBufferedBytes, ARGV[7] TTL (ms), ARGV[8] eviction batch,
  ARGV[9] maxChannelBufferedBytes: what the records of the member's scope may claim

  Returns:
    {'granted', epoch, increase, grantId}   grantId: unique, lets the sequence ignore a resent call
    {'backpressure', 'maxOpenSequences' | 'maxChannelBufferedBytes' | 'maxBufferedBytes'}
    {'evict', {member, retainUntil, ...}}  failed sequences' kept fragments to drop first, oldest
                                           first, as many as cover the shortfall (at most a batch);
                                           only when the grant then passes every limit
]]
--- @include "_clock"
--- @include "_global"

dropOrphanedTotals()

local member, increase, now = ARGV[1], tonumber(ARGV[2]), callerTime(ARGV[3])
local provisionalDue, maxOpen, maxBytes = callerTime(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl, evictBatch = tonumber(ARGV[7]), tonumber(ARGV[8])
local maxChannelBytes = tonumber(ARGV[9]) or maxBytes

local record = readRecord(member)
if not record and rcall('HLEN', openKey) >= maxOpen then
  return {'backpressure', 'maxOpenSequences'}
end
-- Kept fragments of failed sequences go only to let this grant through: not when it would be
-- back-pressured without them anyway (they count in no scope's claim).
local claimed = total('claimed')
if increase > 0 and claimed + increase > maxBytes then
  return {'backpressure', 'maxBufferedBytes'}
end
if increase > 0 and scopeClaimed(member) + increase > maxChannelBytes then
  return {'backpressure', 'maxChannelBufferedBytes'}
end
local shortfall = claimed + total('retained') + increase - maxBytes
if increase > 0 and shortfall > 0 then
  -- The oldest kept fragments that make the room (up to a batch), and no more.
  local oldest = rcall('ZRANGE', retentionKey, 0, evictBatch - 1, 'WITHSCORES')
  local victims, freed = {}, 0
  for i = 1, #oldest, 2 do
    victims[#victims + 1] = oldest[i]
    victims[#victims + 1] = oldest[i + 1]
    local kept = rcall('HGET', retainedKey, oldest[i])
    freed = freed + (tonumber(kept and string.match(kept, ':(%d+)$')) or 0)
    if freed >= shortfall then
      break
    end
  end
  return {'evict', victims}
end

-- Epochs and grant ids never repeat, even if these keys expired meanwhile: the counter never
-- falls below the server clock (microseconds).
local function nextId()
  local id = tonumber(rcall('HINCRBY', totalsKey, 'epoch', 1))
  local time = rcall('TIME')
  local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
  if id < floor then
    id = floor
    rcall('HSET', totalsKey, 'epoch', int(id))
  end
  return id
end

if not record then
  record = {epoch = nextId(), claim = 0, ver = 0, stored = 0}
  rcall('ZADD', dueKey, int(provisionalDue), member)
  rcall('ZADD', firstKey, int(now), member)
end
record.claim = record.claim + increase
writeRecord(member, record)
addClaim(member, increase)
extendAll(ttl)
return {'granted', int(record.epoch), int(increase), int(nextId())}
