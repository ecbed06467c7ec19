--[[
  Helpers shared by the per-sequence scripts (textually included by the script loader).
  Every per-sequence script works on the keys of ONE sequence, which share a hash tag:
    meta   hash    the sequence's state (see readSequence)
    crc    hash    position -> CRC-32
    body   hash    position -> body (binary), for bodies sent inline (small ones)
    body:<position>  string  a body staged by the client (large ones), renamed into place
    done   hash    the finished marker {outcome, reason, until, fence}
    fence  string  budget epoch fence while there is no marker
]]
local rcall = redis.call

-- Decimal digits of an integral number (tostring switches to exponent form past 1e14).
local function int(n)
  return string.format('%d', n)
end

-- Extends a key's TTL to at least ttl ms: never shortens it, never revives a missing key.
local function extendTtl(key, ttl)
  local current = rcall('PTTL', key)
  if current ~= -2 and current < ttl then
    rcall('PEXPIRE', key, ttl)
  end
end

-- The highest budget epoch that may no longer open this sequence.
local function fenceOf(doneKey, fenceKey)
  return math.max(tonumber(rcall('HGET', doneKey, 'fence')) or 0,
    tonumber(rcall('GET', fenceKey)) or 0)
end

-- Raises the fence to epoch: in the marker when there is one, else in the fence key.
local function raiseFence(doneKey, fenceKey, epoch, ttl)
  if epoch <= 0 or fenceOf(doneKey, fenceKey) >= epoch then
    return
  end
  if rcall('EXISTS', doneKey) == 1 then
    rcall('HSET', doneKey, 'fence', int(epoch))
  else
    rcall('SET', fenceKey, int(epoch), 'PX', ttl)
  end
end

-- Writes the finished marker, which carries the fence from then on; returns its TTL.
local function writeMarker(doneKey, fenceKey, outcome, reason, untilAt, epoch, now, margin)
  local fence = math.max(fenceOf(doneKey, fenceKey), epoch)
  rcall('DEL', doneKey, fenceKey)
  rcall('HSET', doneKey, 'outcome', outcome, 'until', int(untilAt), 'fence', int(fence))
  if reason then
    rcall('HSET', doneKey, 'reason', reason)
  end
  local ttl = math.max(untilAt - now, 0) + margin
  rcall('PEXPIRE', doneKey, ttl)
  return ttl
end

local SEQUENCE_FIELDS = {'state', 'epoch', 'claim', 'ver', 'size', 'lastPosition',
  'declaredBytes', 'sha256', 'highestPosition', 'storedBytes', 'firstAt', 'lastAt', 'deadline',
  'expiryMs', 'leaseOwner', 'leaseUntil', 'contentType', 'contentEncoding', 'userHeaders',
  'headerBytes', 'retainUntil'}

-- The sequence held in meta; state is nil when none is ('open' or 'failed' otherwise). Read by
-- name: meta also holds one 'g:<id>' field per budget grant the sequence consumed.
local function readSequence(metaKey, crcKey)
  local values = rcall('HMGET', metaKey, unpack(SEQUENCE_FIELDS))
  local h = {}
  for i, name in ipairs(SEQUENCE_FIELDS) do
    h[name] = values[i] or nil
  end
  return {
    state = h.state,
    epoch = tonumber(h.epoch) or 0,
    claim = tonumber(h.claim) or 0,
    ver = tonumber(h.ver) or 0,
    size = tonumber(h.size),
    lastPosition = tonumber(h.lastPosition),
    declaredBytes = tonumber(h.declaredBytes),
    sha256 = h.sha256,
    highestPosition = tonumber(h.highestPosition) or 0,
    storedBytes = tonumber(h.storedBytes) or 0,
    count = rcall('HLEN', crcKey),
    firstAt = tonumber(h.firstAt) or 0,
    lastAt = tonumber(h.lastAt) or 0,
    deadline = tonumber(h.deadline) or 0,
    expiryMs = tonumber(h.expiryMs) or 0,
    leaseOwner = h.leaseOwner,
    leaseUntil = tonumber(h.leaseUntil),
    contentType = h.contentType,
    contentEncoding = h.contentEncoding,
    userHeaders = h.userHeaders or '{}',
    -- The kept headers' budget bytes: their JSON's length, also when they are kept sealed.
    headerBytes = tonumber(h.headerBytes) or #(h.userHeaders or '{}'),
    retainUntil = tonumber(h.retainUntil),
  }
end

local function saveSequence(metaKey, s)
  local fields = {'state', s.state, 'epoch', int(s.epoch), 'claim', int(s.claim),
    'ver', int(s.ver), 'highestPosition', int(s.highestPosition),
    'storedBytes', int(s.storedBytes), 'firstAt', int(s.firstAt), 'lastAt', int(s.lastAt),
    'deadline', int(s.deadline), 'expiryMs', int(s.expiryMs), 'userHeaders', s.userHeaders,
    'headerBytes', int(s.headerBytes)}
  local optional = {size = s.size, lastPosition = s.lastPosition,
    declaredBytes = s.declaredBytes, leaseUntil = s.leaseUntil, retainUntil = s.retainUntil}
  for name, value in pairs(optional) do
    fields[#fields + 1] = name
    fields[#fields + 1] = int(value)
  end
  local strings = {sha256 = s.sha256, leaseOwner = s.leaseOwner, contentType = s.contentType,
    contentEncoding = s.contentEncoding}
  for name, value in pairs(strings) do
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  rcall('HSET', metaKey, unpack(fields))
end

-- core/completeness.ts SEQUENCE_OVERHEAD_BYTES and FRAGMENT_OVERHEAD_BYTES (set by the loader).
local SEQUENCE_OVERHEAD_BYTES = {{SEQUENCE_OVERHEAD_BYTES}}
local FRAGMENT_OVERHEAD_BYTES = {{FRAGMENT_OVERHEAD_BYTES}}

-- core/completeness.ts storedCharge: bodies, the kept user headers and the fixed overheads.
local function storedCharge(s)
  return SEQUENCE_OVERHEAD_BYTES + s.headerBytes + s.count * FRAGMENT_OVERHEAD_BYTES +
    s.storedBytes
end

-- core/completeness.ts accountedAfter: the budget a sequence holds once a new fragment of
-- bodyBytes is stored (opening: with headers of headerBytes): its declared fragments and bytes
-- are reserved from the moment they are known.
local function accountedAfter(s, opening, bodyBytes, headerBytes, declared, size)
  local headers = opening and headerBytes or s.headerBytes
  local fragments = math.max(s.count + 1, s.size or size or 0)
  local body = math.max(declared or 0, s.storedBytes + bodyBytes)
  return SEQUENCE_OVERHEAD_BYTES + headers + fragments * FRAGMENT_OVERHEAD_BYTES + body
end

-- core/completeness.ts isComplete
local function isComplete(s)
  return s.size ~= nil and s.highestPosition <= s.size and s.count == s.size
end

-- When the sweeper may take it: incomplete, at its deadline; complete, expiryMs after its lease.
local function dueAt(s)
  if isComplete(s) then
    return (s.leaseUntil or s.lastAt) + s.expiryMs
  end
  return s.deadline
end

local function sequenceTtl(s, now, leaseMs, margin)
  return math.max(dueAt(s) - now, 0) + leaseMs + margin
end

-- The string key of the body at a position, when it was staged rather than sent inline.
local function bodyKeyAt(bodyKey, position)
  return bodyKey .. ':' .. position
end

-- A body staged by the client (redis-keys.ts stagedBodyKey): <sequence>:staged:<id>, in the slot
-- of the sequence's keys, whose body key is <sequence>:body.
local function stagedBodyKey(bodyKey, id)
  return string.sub(bodyKey, 1, -6) .. ':staged:' .. id
end

-- Extends the sequence's keys to at least ttl. The per-position body keys are visited only when
-- meta needs it: each is created with at least meta's TTL and extended with it, so it outlives
-- meta. Meta needs it rarely: when it does, every key gets a tenth more than asked, and the calls
-- that follow find meta long enough. Without that slack a TTL that grows with every accept (a
-- sliding expiry; a consumer whose clock runs behind the others') visited every stored position
-- on every accept: quadratic in the sequence's fragments. Now once per tenth of the TTL.
local function extendSequenceTtl(metaKey, crcKey, bodyKey, ttl)
  local current = rcall('PTTL', metaKey)
  if current ~= -2 and current >= ttl then
    extendTtl(crcKey, ttl)
    extendTtl(bodyKey, ttl)
    return
  end
  local target = ttl + math.floor(ttl / 10)
  extendTtl(metaKey, target)
  extendTtl(crcKey, target)
  extendTtl(bodyKey, target)
  for _, position in ipairs(rcall('HKEYS', crcKey)) do
    extendTtl(bodyKeyAt(bodyKey, position), target)
  end
end

-- Sets the sequence's keys' TTL to ttl (retention of a failed sequence).
local function setSequenceTtl(metaKey, crcKey, bodyKey, ttl)
  rcall('PEXPIRE', metaKey, ttl)
  rcall('PEXPIRE', crcKey, ttl)
  rcall('PEXPIRE', bodyKey, ttl)
  for _, position in ipairs(rcall('HKEYS', crcKey)) do
    rcall('PEXPIRE', bodyKeyAt(bodyKey, position), ttl)
  end
end

-- Removes everything the sequence holds but its marker and fence.
local function dropSequence(metaKey, crcKey, bodyKey)
  for _, position in ipairs(rcall('HKEYS', crcKey)) do
    rcall('UNLINK', bodyKeyAt(bodyKey, position))
  end
  rcall('DEL', metaKey, crcKey, bodyKey)
end

-- What the global index learns after a change: {epoch, ver, stored charge, firstAt, dueAt,
-- refund, keyTtl}.
local function settlement(s, refund, ttl)
  return {int(s.epoch), int(s.ver), int(storedCharge(s)), int(s.firstAt), int(dueAt(s)),
    int(refund), int(ttl)}
end
