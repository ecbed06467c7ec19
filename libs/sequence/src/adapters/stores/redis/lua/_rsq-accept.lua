-- The body of rsq-accept (see rsq-accept-3.lua for KEYS, ARGV and returns), as a function, so that
-- the single-node variants rsq-accept-ix-8 and rsq-accept-batch-n can apply the scope index inline
-- after it. A: the arguments, laid out as rsq-accept-3's ARGV (default ARGV), as strings.
local function acceptStep(A)
  local ARGV = A or ARGV
  local now, start, seq = callerTime(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local entry = ARGV[4]
  local maxPerKey, maxTotal, seenTotal = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local retentionMs = tonumber(ARGV[8])
  local holder, leaseMs, limit = ARGV[9] or '', tonumber(ARGV[10]), tonumber(ARGV[11])
  -- Byte bounds (0: none), and the scope's buffered bytes as the caller last saw them.
  local maxBytesPerKey, maxBytesTotal = tonumber(ARGV[12]) or 0, tonumber(ARGV[13]) or 0
  local seenBytes = tonumber(ARGV[14]) or 0
  -- Furthest an event to be buffered may be ahead of next (0: no bound).
  local maxAhead = tonumber(ARGV[15]) or 0
  local bytes = entryBytes(entry)

  -- The per-key bound that holding this event as well would pass, if any: the buffer and the
  -- hand-off list count, events and bytes.
  local function keyRefusal(s, size, listed)
    if size + listed >= maxPerKey then
      return 'maxBufferedPerKey'
    end
    if maxBytesPerKey > 0 and s.bufBytes + s.hoBytes + bytes > maxBytesPerKey then
      return 'maxBufferedBytesPerKey'
    end
    return nil
  end

  -- With a holder, a release also claims the drain lease (as rsq-claim): appended to the reply
  -- as 'claimed' and the head items, or 'busy'. The state is saved by the caller when changed.
  local function claimFor(s, reply)
    if s.holder and s.holder ~= holder and s.leaseUntil and s.leaseUntil > now then
      reply[#reply + 1] = 'busy'
      return reply
    end
    s.holder, s.leaseUntil = holder, now + leaseMs
    reply[#reply + 1] = 'claimed'
    for _, item in ipairs(rcall('LRANGE', handOffKey, 0, limit - 1)) do
      reply[#reply + 1] = item
    end
    return reply
  end

  local s = loadState(now, retentionMs)
  local expected = s.next or start
  -- A closed key answers an event released before it closed (a repeat) with the sequence that
  -- went missing: an ordinary late event, not one the close refuses.
  if s.closedFrom and seq < s.closedFrom then
    expected = s.closedFrom
  end

  if seq < expected then
    local pending = rcall('LLEN', handOffKey) > 0 and 1 or 0
    local reply = {'late', indexRecordIf(s, false), expected, pending}
    if pending == 0 or holder == '' then
      return reply
    end
    claimFor(s, reply)
    if reply[5] == 'claimed' then
      local record = saveClaim(s, now, retentionMs)
      if record then
        reply[2] = record
      end
    end
    return reply
  end

  if seq == expected then
    -- The event that fills the gap is refused only while a drain will make room for it.
    local listed = rcall('LLEN', handOffKey)
    if listed > 0 then
      local refused = keyRefusal(s, rcall('ZCARD', bufferKey), listed)
      if refused then
        return {'full', indexRecordIf(s, false), expected, refused}
      end
    end
    -- As beforeAppend, with the length just read: an empty list starts its stall clock now.
    if listed == 0 then
      s.handOffAt = now
      s.createdHandOff = true
    end
    rcall('RPUSH', handOffKey, 'e' .. entry)
    s.next = seq + 1
    s.hoBytes = s.hoBytes + bytes
    -- The usual case, an event in order past an empty buffer, needs neither the buffer scan nor
    -- the index.
    local bufferEmpty = rcall('ZCARD', bufferKey) == 0
    local moved, left = 0, 0
    if bufferEmpty then
      s.gapSince, s.alerted, s.bufBytes = nil, false, 0
    else
      moved = releaseRun(s)
      left = afterRelease(s, now)
    end
    local reply = {'released', {}, s.next, 1 + moved}
    if holder ~= '' then
      claimFor(s, reply)
    end
    saveState(s, now, retentionMs)
    if bufferEmpty then
      reply[2] = (s.track or s.reset) and indexRecord(s, 0) or {}
    else
      -- Events moved out of the buffer, or a new gap behind it: the index must know.
      reply[2] = indexRecord(s, left)
    end
    return reply
  end

  -- The buffer's scores are its sequences: one of them equal to seq is the same event.
  if rcall('ZCOUNT', bufferKey, ARGV[3], ARGV[3]) > 0 then
    return {'duplicate', indexRecordIf(s, false), expected}
  end
  if maxAhead > 0 and seq - expected > maxAhead then
    return {'full', indexRecordIf(s, false), expected, 'maxSeqAhead'}
  end
  local size = rcall('ZCARD', bufferKey)
  local refused = keyRefusal(s, size, rcall('LLEN', handOffKey))
  if refused then
    return {'full', indexRecordIf(s, false), expected, refused}
  end
  if seenTotal >= maxTotal then
    return {'full', indexRecordIf(s, false), expected, 'maxBufferedTotal'}
  end
  if maxBytesTotal > 0 and seenBytes + bytes > maxBytesTotal then
    return {'full', indexRecordIf(s, false), expected, 'maxBufferedBytesTotal'}
  end

  s.next = expected
  rcall('ZADD', bufferKey, ARGV[3], entry)
  if size == 0 then
    s.gapSince, s.alerted = now, false
    s.createdBuffer = true
    s.bufBytes = 0
  end
  s.bufBytes = s.bufBytes + bytes
  saveState(s, now, retentionMs)
  return {'buffered', indexRecord(s, size + 1), expected, size + 1}
end
