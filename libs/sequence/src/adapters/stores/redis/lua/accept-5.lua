--[[
  accept: admits one fragment into its sequence, atomically (the per-sequence step of accept).
  Mirrors core/completeness.ts exactly: contradictions first, then duplicate / conflicting
  duplicate, then bytes beyond the declared total, then the per-sequence limits.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body, KEYS[4] done, KEYS[5] fence

  ARGV[1]  now (ms)                ARGV[2]  consumer id            ARGV[3]  lease ms
  ARGV[4]  expiry ms               ARGV[5]  '1' when sliding       ARGV[6]  retention ms
  ARGV[7]  key TTL margin ms       ARGV[8]  maxSequenceBytes       ARGV[9]  maxFragments
  ARGV[10] position                ARGV[11] size, or ''            ARGV[12] '1' when last
  ARGV[13] crc32                   ARGV[14] sha256, or ''          ARGV[15] bytes, or ''
  ARGV[16] body length             ARGV[17] content-type, or ''    ARGV[18] content-encoding, or ''
  ARGV[19] user headers as kept: their JSON, or its base64 sealed (a store that encrypts)
  ARGV[20] the user headers' budget bytes (their JSON's length)
  ARGV[21] grant epoch (0: none)   ARGV[22] grant bytes            ARGV[23] grant id (unique)
  ARGV[24] ms the sequence started before now (AcceptContext.startedAt): when it opens, its
           first fragment's time and fixed deadline count from then
  ARGV[25] 'inline' or 'staged'; when absent the fragment is only admitted ('go', not stored)
  ARGV[26] inline: the body, stored in the body hash; staged: the id of a string key in this
           slot, <sequence>:staged:<id> (KEYS[3] with `:body` replaced), holding the body (set by
           the client just before, with a short TTL), renamed to body:<position> when stored and
           deleted otherwise: a large body never goes through Lua, which copies an argument into
           a Lua string and again into the hash. Only the id is passed: a key name built from
           KEYS carries the client's key prefix, one passed in ARGV would not

  Returns {code, settlement, forgetEpoch, ...}:
    settlement   {} or {epoch, ver, storedBytes, firstAt, dueAt, refund, keyTtl} for the index
    forgetEpoch  0, or a budget epoch fenced here that the caller must forget in the index
    'finished', outcome, reason | false        the marker is live
    'rejected', code, detail                   a contradiction; nothing changed
    'dropped', code, detail                    over a per-sequence limit: dropped, marked rejected
    'duplicate' | 'in-progress'
    'stored', opened
    'complete', opened, fragments, bytes, sha256 | false, declaredBytes | false,
                contentType | false, contentEncoding | false, userHeaders, firstAt, lastAt,
                stored                         1 when this call stored the body; 0 for a copy
                                               taking a complete sequence over (stored nothing)
    'need', bytes, opening, total              reserve that many more bytes (opening: 1; any grant);
                                               total: the budget the sequence holds once stored
    'go'                                       admissible with the budget held: send the body
    'void'                                     the grant's epoch is dead (fenced): forget, retry
]]
--- @include "_clock"
--- @include "_sequence"

local metaKey, crcKey, bodyKey, doneKey, fenceKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = callerTime(ARGV[1])
local consumerId = ARGV[2]
local leaseMs = tonumber(ARGV[3])
local expiryMs = tonumber(ARGV[4])
local sliding = ARGV[5] == '1'
local retentionMs = tonumber(ARGV[6])
local margin = tonumber(ARGV[7])
local maxSequenceBytes = tonumber(ARGV[8])
local maxFragments = tonumber(ARGV[9])
local position = tonumber(ARGV[10])
local size = tonumber(ARGV[11])
local last = ARGV[12] == '1'
local crc = tonumber(ARGV[13])
local sha256 = ARGV[14] ~= '' and ARGV[14] or nil
local bytes = tonumber(ARGV[15])
local bodyBytes = tonumber(ARGV[16])
local contentType = ARGV[17] ~= '' and ARGV[17] or nil
local contentEncoding = ARGV[18] ~= '' and ARGV[18] or nil
local grantEpoch = tonumber(ARGV[21])
local grantBytes = tonumber(ARGV[22])
local grantField = 'g:' .. ARGV[23]
local startedAt = now - tonumber(ARGV[24])
local hasBody = #ARGV >= 26
local stagedKey = ARGV[25] == 'staged' and stagedBodyKey(bodyKey, ARGV[26]) or nil

local function run()

local marker = rcall('HMGET', doneKey, 'outcome', 'reason', 'until')
local s = readSequence(metaKey, crcKey)

-- A grant the sequence consumed already: this is the client resending a call after a reconnect.
if grantEpoch > 0 and s.state == 'open' and rcall('HEXISTS', metaKey, grantField) == 1 then
  grantEpoch, grantBytes = 0, 0
end

-- A grant this call does not use: refunded when it is the sequence's, else fenced and forgotten.
local function unused(code, a, b)
  if grantEpoch == 0 then
    return {code, {}, 0, a, b}
  end
  if s.state == 'open' and grantEpoch == s.epoch then
    s.ver = s.ver + 1
    rcall('HSET', metaKey, 'ver', int(s.ver), grantField, '1')
    return {code, settlement(s, grantBytes, sequenceTtl(s, now, leaseMs, margin)), 0, a, b}
  end
  raiseFence(doneKey, fenceKey, grantEpoch, margin)
  return {code, {}, grantEpoch, a, b}
end

local function describe(code, opened, refund, stored)
  return {code, settlement(s, refund, sequenceTtl(s, now, leaseMs, margin)), 0, opened and 1 or 0,
    s.count, s.storedBytes, s.sha256 or false, s.declaredBytes and int(s.declaredBytes) or false,
    s.contentType or false, s.contentEncoding or false, s.userHeaders, s.firstAt, s.lastAt,
    stored and 1 or 0}
end

if marker[1] then
  if tonumber(marker[3]) > now then
    return unused('finished', marker[1], marker[2] or false)
  end
  -- Past its retention: forget the marker (and a failed sequence's fragments), keep the fence.
  local fence = fenceOf(doneKey, fenceKey)
  rcall('DEL', doneKey)
  if fence > 0 then
    rcall('SET', fenceKey, int(fence), 'PX', margin)
  end
end
if s.state ~= 'open' then
  dropSequence(metaKey, crcKey, bodyKey)
  s = readSequence(metaKey, crcKey)
end
local exists = s.state == 'open'

-- core/completeness.ts findContradiction
local function contradiction()
  if last and s.lastPosition and position ~= s.lastPosition then
    return 'duplicate-last', 'position ' .. int(position) .. ' claims to be last, position ' ..
      int(s.lastPosition) .. ' already is'
  end
  if size and s.size and size ~= s.size then
    return 'size-changed', 'size ' .. int(size) .. ' differs from the declared size ' .. int(s.size)
  end
  local knownSize = s.size or size
  if knownSize and position > knownSize then
    return 'position-out-of-range', 'position ' .. int(position) .. ' is beyond size ' ..
      int(knownSize)
  end
  if knownSize and position == knownSize and not last then
    return 'malformed-header', 'position ' .. int(position) .. ' is the last one (size ' ..
      int(knownSize) .. ') but x-sequence-last is not set'
  end
  if s.lastPosition and position > s.lastPosition then
    return 'position-out-of-range', 'position ' .. int(position) ..
      ' is beyond the last position ' .. int(s.lastPosition)
  end
  if size and s.highestPosition > size then
    return 'position-out-of-range', 'size ' .. int(size) .. ' is below the stored position ' ..
      int(s.highestPosition)
  end
  if size and not s.size and position ~= size and s.lastPosition ~= size and exists
      and rcall('HEXISTS', crcKey, int(size)) == 1 then
    return 'malformed-header', 'size ' .. int(size) .. ' makes position ' .. int(size) ..
      ' the last one, but it was stored without x-sequence-last'
  end
  if bytes and s.declaredBytes and bytes ~= s.declaredBytes then
    return 'declaration-changed', 'x-sequence-bytes ' .. int(bytes) ..
      ' differs from the declared ' .. int(s.declaredBytes)
  end
  if sha256 and s.sha256 and sha256 ~= s.sha256 then
    return 'declaration-changed', 'x-sequence-sha256 ' .. sha256 .. ' differs from the declared ' ..
      s.sha256
  end
  -- A fragment that carries none agrees with any: the first one carried is the sequence's.
  if contentType and s.contentType and contentType ~= s.contentType then
    return 'declaration-changed', 'content-type ' .. contentType .. ' differs from the declared ' ..
      s.contentType
  end
  if contentEncoding and s.contentEncoding and contentEncoding ~= s.contentEncoding then
    return 'declaration-changed', 'content-encoding ' .. contentEncoding ..
      ' differs from the declared ' .. s.contentEncoding
  end
  return nil
end

local rejection, detail = contradiction()
if rejection then
  return unused('rejected', rejection, detail)
end

local storedCrc = exists and rcall('HGET', crcKey, int(position))
if storedCrc then
  if tonumber(storedCrc) ~= crc then
    return unused('rejected', 'conflicting-duplicate', 'position ' .. int(position) ..
      ' is stored with crc32 ' .. storedCrc .. ', this copy has crc32 ' .. int(crc))
  end
  if not isComplete(s) then
    return unused('duplicate')
  end
  if s.leaseUntil and s.leaseUntil > now then
    return unused('in-progress')
  end
  -- Complete and nobody holds it: this caller takes the completion over, storing nothing (the
  -- body at its position stays the one stored first).
  s.leaseOwner, s.leaseUntil, s.ver = consumerId, now + leaseMs, s.ver + 1
  local refund = (grantEpoch > 0 and grantEpoch == s.epoch) and grantBytes or 0
  if grantEpoch > 0 and grantEpoch ~= s.epoch then
    raiseFence(doneKey, fenceKey, grantEpoch, margin)
  end
  saveSequence(metaKey, s)
  if refund > 0 then
    rcall('HSET', metaKey, grantField, '1')
  end
  extendSequenceTtl(metaKey, crcKey, bodyKey, sequenceTtl(s, now, leaseMs, margin))
  local reply = describe('complete', false, refund, false)
  reply[3] = (grantEpoch > 0 and grantEpoch ~= s.epoch) and grantEpoch or 0
  return reply
end

-- Checked after duplicates, which add no bytes.
local declaredBytes = s.declaredBytes or bytes
if declaredBytes and s.storedBytes + bodyBytes > declaredBytes then
  return unused('rejected', 'declaration-changed', int(s.storedBytes + bodyBytes) ..
    ' bytes received exceed the declared x-sequence-bytes ' .. int(declaredBytes))
end

local limit, limitDetail
if math.max(size or 0, position) > maxFragments then
  limit = 'too-many-fragments'
  limitDetail = (size and ('size ' .. int(size)) or ('position ' .. int(position))) ..
    ' exceeds maxFragments (' .. int(maxFragments) .. ')'
elseif bytes and bytes > maxSequenceBytes then
  limit = 'sequence-too-large'
  limitDetail = 'declared ' .. int(bytes) .. ' bytes exceed maxSequenceBytes (' ..
    int(maxSequenceBytes) .. ')'
elseif s.storedBytes + bodyBytes > maxSequenceBytes then
  limit = 'sequence-too-large'
  limitDetail = int(s.storedBytes + bodyBytes) .. ' bytes received exceed maxSequenceBytes (' ..
    int(maxSequenceBytes) .. ')'
end
if limit then
  if not exists then
    -- Nothing stored: no marker either, so rejected first fragments cost nothing to keep.
    return unused('rejected', limit, limitDetail)
  end
  -- The whole sequence goes; its budget record (or the grant's) is forgotten by the caller.
  local forget = math.max(s.epoch, grantEpoch)
  dropSequence(metaKey, crcKey, bodyKey)
  writeMarker(doneKey, fenceKey, 'rejected', limit .. ': ' .. limitDetail, now + retentionMs, forget,
    now, margin)
  return {'dropped', {}, forget, limit, limitDetail}
end

-- A new fragment: it needs a grant that covers the budget it adds (and, to open, a live epoch).
local opening = not exists
if grantEpoch > 0 then
  local valid
  if opening then
    valid = grantEpoch > fenceOf(doneKey, fenceKey)
  else
    valid = grantEpoch == s.epoch
  end
  if not valid then
    raiseFence(doneKey, fenceKey, grantEpoch, margin)
    return {'void', {}, grantEpoch}
  end
end
local headerBytes = tonumber(ARGV[20])
local accounted = accountedAfter(s, opening, bodyBytes, headerBytes, declaredBytes, size)
local available = s.claim + grantBytes
if opening and grantEpoch == 0 then
  return {'need', {}, 0, int(accounted), 1, int(accounted)}
end
if accounted > available then
  return {'need', {}, 0, int(accounted - available), opening and 1 or 0, int(accounted)}
end
-- A staged body gone (its TTL ran out before this call): as if it had not been sent.
if not hasBody or (stagedKey and rcall('EXISTS', stagedKey) == 0) then
  return {'go', {}, 0}
end

-- core/completeness.ts recordFragment
if opening then
  dropSequence(metaKey, crcKey, bodyKey)
  s = readSequence(metaKey, crcKey)
  s.state, s.epoch, s.firstAt = 'open', grantEpoch, startedAt
  s.expiryMs, s.deadline, s.userHeaders = expiryMs, startedAt + expiryMs, ARGV[19]
  s.headerBytes = headerBytes
end
rcall('HSET', crcKey, int(position), int(crc))
if stagedKey then
  local target = bodyKeyAt(bodyKey, int(position))
  rcall('RENAME', stagedKey, target)
  stagedKey = nil
  rcall('PEXPIRE', target, math.max(sequenceTtl(s, now, leaseMs, margin), rcall('PTTL', metaKey)))
else
  rcall('HSET', bodyKey, int(position), ARGV[26])
end
s.count = s.count + 1
s.highestPosition = math.max(s.highestPosition, position)
s.storedBytes = s.storedBytes + bodyBytes
s.lastAt = now
if size then s.size = size end
if last then s.lastPosition = position end
if bytes then s.declaredBytes = bytes end
if sha256 then s.sha256 = sha256 end
if not s.contentType then s.contentType = contentType end
if not s.contentEncoding then s.contentEncoding = contentEncoding end
if sliding then s.deadline = now + expiryMs end
s.claim = accounted
s.ver = s.ver + 1
local complete = isComplete(s)
if complete then
  s.leaseOwner, s.leaseUntil = consumerId, now + leaseMs
end
saveSequence(metaKey, s)
if grantEpoch > 0 then
  rcall('HSET', metaKey, grantField, '1')
end
extendSequenceTtl(metaKey, crcKey, bodyKey, sequenceTtl(s, now, leaseMs, margin))

if complete then
  return describe('complete', opening, available - accounted, true)
end
return {'stored', settlement(s, available - accounted, sequenceTtl(s, now, leaseMs, margin)), 0,
  opening and 1 or 0}
end

local reply = run()
-- A staged body that was not stored goes now: nothing is left for its TTL to collect.
if stagedKey then
  rcall('DEL', stagedKey)
end
return reply
