--[[
  expire: the sweeper's claim on one sequence, by the budget epoch the global index holds for it.
  Due: incomplete past its deadline, or complete and abandoned for expiryMs after its lease.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body, KEYS[4] done, KEYS[5] fence
  ARGV[1] now (ms), ARGV[2] retention ms, ARGV[3] epoch of the index's record, ARGV[4] key TTL
  margin ms, ARGV[5] this call's token (unique per call)

  A call sent again within a minute of one that expired the sequence (its reply was lost and the
  client resent it: the same token) answers 'expired' again, from a report kept that long (at
  most as long as the marker) in `<done>:expire-report` (the sequence's hash tag, so its slot).

  Returns:
    {'expired', markerTtl, size | false, storedBytes, firstAt, lastAt, {positions...}, ageMs}
        dropped and marked 'expired'; the caller forgets the record
    {'not-due', settlement}   the index's due time was stale; the caller reschedules
    {'stale', retainUntil, retainedBytes}
                              no open sequence: the epoch is fenced; the caller forgets the record,
                              recording the fragments a failed finish of this epoch keeps until
                              retainUntil (0, 0 when none: that finish updated the index itself)
    {'other'}                 an open sequence under another epoch: leave everything as it is
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey, bodyKey, doneKey, fenceKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, retentionMs = callerTime(ARGV[1]), tonumber(ARGV[2])
local epoch, margin = tonumber(ARGV[3]), tonumber(ARGV[4])

local token = ARGV[5] or ''
local reportKey = doneKey .. ':expire-report'
local s = readSequence(metaKey, crcKey)
if s.state ~= 'open' and token ~= '' then
  local stored = rcall('GET', reportKey)
  if stored then
    local report = cjson.decode(stored)
    if report[1] == token then
      return report[2]
    end
  end
end
if s.state ~= 'open' then
  raiseFence(doneKey, fenceKey, epoch, margin)
  if s.state == 'failed' and s.epoch == epoch and (s.retainUntil or 0) > now then
    return {'stale', int(s.retainUntil), int(storedCharge(s))}
  end
  return {'stale', 0, 0}
end
if s.epoch ~= epoch then
  return {'other'}
end
local due = dueAt(s)
if due > now then
  return {'not-due', settlement(s, 0, sequenceTtl(s, now, 0, margin))}
end

local positions = rcall('HKEYS', crcKey)
local missing = (s.size or s.highestPosition) - s.count
local ageMs = now - s.firstAt
dropSequence(metaKey, crcKey, bodyKey)
local markerTtl = writeMarker(doneKey, fenceKey, 'expired', int(missing) ..
  ' fragment(s) missing after ' .. int(ageMs) .. ' ms', now + retentionMs, s.epoch, now, margin)
local reply = {'expired', int(markerTtl), s.size and int(s.size) or false, int(s.storedBytes),
  int(s.firstAt), int(s.lastAt), positions, int(ageMs)}
if token ~= '' then
  -- A minute is ample for a client's resend (positions can be many: not for the retention), and
  -- never longer than the marker.
  rcall('SET', reportKey, cjson.encode({token, reply}), 'PX', math.max(1, math.min(60000, markerTtl)))
end
return reply
