--[[
  rsq-accept: one event offered to its resequencer key (the resequencer store's `accept`).
  Checks, in order: late (below next), next in line (released with the contiguous run after it),
  duplicate (already buffered), the limits, and else buffers it.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)               ARGV[2] start (next while the key has no state)
  ARGV[3] seq                    ARGV[4] the entry, encoded by the client
  ARGV[5] maxBufferedPerKey      ARGV[6] maxBufferedTotal
  ARGV[7] the scope's buffered total as the caller last saw it (checked against ARGV[6])
  ARGV[8] retention ms

  Returns {code, record, ...} (record: see _resequencer; sent on every outcome, so that a
  redelivered event repairs an index step lost to a crash):
    'late', record, next, pending (1 while the hand-off list is not empty)
    'released', record, next, count
    'duplicate', record, next
    'full', record, next, 'maxBufferedPerKey' | 'maxBufferedTotal'
    'buffered', record, next, buffered
]]
--- @include "_resequencer"

local now, start, seq = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local entry = ARGV[4]
local maxPerKey, maxTotal, seenTotal = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local retentionMs = tonumber(ARGV[8])

local s = loadState(now, retentionMs)
local expected = s.next or start

if seq < expected then
  local pending = rcall('LLEN', handOffKey) > 0 and 1 or 0
  return {'late', indexRecord(s), expected, pending}
end

if seq == expected then
  beforeAppend(s, now)
  rcall('RPUSH', handOffKey, 'e' .. entry)
  s.next = seq + 1
  local count = 1 + releaseRun(s)
  afterRelease(s, now)
  saveState(s, now, retentionMs)
  return {'released', indexRecord(s), s.next, count}
end

-- The buffer's scores are its sequences: one of them equal to seq is the same event.
if rcall('ZCOUNT', bufferKey, ARGV[3], ARGV[3]) > 0 then
  return {'duplicate', indexRecord(s), expected}
end
local size = rcall('ZCARD', bufferKey)
if size >= maxPerKey then
  return {'full', indexRecord(s), expected, 'maxBufferedPerKey'}
end
if seenTotal >= maxTotal then
  return {'full', indexRecord(s), expected, 'maxBufferedTotal'}
end

s.next = expected
rcall('ZADD', bufferKey, ARGV[3], entry)
if size == 0 then
  s.gapSince, s.alerted = now, false
end
saveState(s, now, retentionMs)
return {'buffered', indexRecord(s), expected, size + 1}
