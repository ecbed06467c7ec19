--[[
  Helpers shared by the per-key resequencer scripts (textually included by the script loader).
  Every per-key script works on the keys of ONE resequencer key, which share a hash tag:
    KEYS[1] state    hash   next, ver, at, gapSince, alerted ('1' | '0'), handOffAt, holder, until,
                            ttlAt, bufBytes, hoBytes (bytes of the buffer's and the hand-off
                            list's events; see entryBytes), closedFrom (the sequence a closed
                            key was missing when it closed), retireAt and retireVer (the
                            key's retirement, in force while its ver is retireVer: see
                            rsq-retire-3)
    KEYS[2] buffer   zset   score = sequence, member = the entry as the client encoded it
    KEYS[3] handoff  list   hand-off items, head first, each a one-character kind tag and fields:
                              'e' .. entry                                        event
                              'd' .. expected .. ':' .. entry                     dead-letter
                              'a' .. expected .. ':' .. buffered .. ':' .. gapSince   gap-alert
                              's' .. from .. ':' .. to                            gap-skipped
  `ttlAt` is when the keys' TTLs were last set (see saveState). Times are the callers' `now` (ms). `ver` grows with every change the scope index must see
  (max(ver + 1, now): it also grows across a key that expired and came back); `at` is the time
  of the last such change. A key expires retentionMs after `at`, or at `retireAt` if sooner:
  logically (a script that finds it expired deletes it and starts afresh) and in real time
  (PEXPIRE retentionMs on each change, shorter on retirement: the safety net for keys nobody
  comes back to).

  The index record a script returns for the scope index (see rsq-index-5.lua), or {} when the
  key has no state or needs no index step (see indexRecordIf): {ver, buffered, next,
  lowest | -1, gapSince | -1, alerted (1 | 0), handOffAt of a tracked hand-off | -1, at,
  bufBytes}.
  `track` ('1' | '0') is set while the hand-off list holds items a gap resolution appended.
]]
local rcall = redis.call
local stateKey, bufferKey, handOffKey = KEYS[1], KEYS[2], KEYS[3]

-- Decimal digits of an integral number (tostring switches to exponent form past 1e14).
local function int(n)
  return string.format('%d', n)
end

local function present(value)
  if value == false then
    return nil
  end
  return value
end

-- The key's state; `next` is nil when the key has none. A key past its retention is deleted
-- first, keeping only its ver (so that the index takes the new key's records as newer).
local function loadState(now, retentionMs)
  local raw = rcall('HMGET', stateKey, 'next', 'ver', 'at', 'gapSince', 'alerted', 'handOffAt',
    'holder', 'until', 'ttlAt', 'track', 'bufBytes', 'hoBytes', 'settled', 'closedFrom',
    'retireAt', 'retireVer')
  local s = {next = tonumber(present(raw[1])), ver = tonumber(present(raw[2])) or 0,
    at = tonumber(present(raw[3])) or 0, gapSince = tonumber(present(raw[4])),
    alerted = raw[5] == '1', handOffAt = tonumber(present(raw[6])), holder = present(raw[7]),
    leaseUntil = tonumber(present(raw[8])), ttlAt = tonumber(present(raw[9])),
    track = raw[10] == '1', bufBytes = tonumber(present(raw[11])) or 0,
    hoBytes = tonumber(present(raw[12])) or 0, lastSettle = present(raw[13]),
    closedFrom = tonumber(present(raw[14])), retireAt = tonumber(present(raw[15]))}
  -- Optional fields stored now: saveState deletes those that became nil, in one HDEL.
  s.stored = {gapSince = raw[4] ~= false, handOffAt = raw[6] ~= false, holder = raw[7] ~= false,
    ['until'] = raw[8] ~= false, retire = raw[15] ~= false}
  -- A retirement holds only while the key is as it was retired: a change that did not end it (an
  -- instance that predates retirement keeps the fields) leaves a ver it was not made for.
  if s.retireAt and tonumber(present(raw[16])) ~= s.ver then
    s.retireAt = nil
  end
  if s.next and (s.at + retentionMs <= now or (s.retireAt and s.retireAt <= now)) then
    rcall('DEL', stateKey, bufferKey, handOffKey)
    -- reset: the index may still count the expired key's events; the next record must reach it.
    return {ver = s.ver, at = 0, alerted = false, stored = {}, reset = true, bufBytes = 0,
      hoBytes = 0}
  end
  if not s.next then
    -- No state: a buffer or hand-off list left from the key's previous life (its TTL, set when
    -- it was created, can outlast the state's by up to retentionMs / 10) must not be reused.
    rcall('DEL', bufferKey, handOffKey)
    s.bufBytes, s.hoBytes = 0, 0
  end
  return s
end

local function setOrDelete(s, fields, deleted, name, value)
  if value == nil then
    if s.stored[name] then
      deleted[#deleted + 1] = name
    end
  else
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
end

-- Writes the state (a change the index must see). TTLs: every key of the key lives at least
-- retentionMs after its last change. Setting three TTLs on every change cost as much as the
-- change, so they are set for retentionMs * 1.1 and renewed once retentionMs / 10 has passed;
-- a key this change created (s.createdBuffer, s.createdHandOff) gets its TTL at once. Real
-- expiry thus stays >= at + retentionMs. A change ends a retirement (the TTLs are set anew).
local function saveState(s, now, retentionMs)
  s.ver = math.max(s.ver + 1, now)
  s.at = math.max(s.at, now)
  local renew = not s.ttlAt or now - s.ttlAt >= retentionMs / 10 or s.retireAt ~= nil
  if renew then
    s.ttlAt = now
  end
  local fields = {'next', int(s.next), 'ver', int(s.ver), 'at', int(s.at), 'alerted',
    s.alerted and '1' or '0', 'ttlAt', int(s.ttlAt), 'track', s.track and '1' or '0',
    'bufBytes', int(s.bufBytes), 'hoBytes', int(s.hoBytes)}
  local deleted = {}
  if s.stored.retire then
    deleted[#deleted + 1] = 'retireAt'
    deleted[#deleted + 1] = 'retireVer'
    s.stored.retire, s.retireAt = false, nil
  end
  setOrDelete(s, fields, deleted, 'gapSince', s.gapSince and int(s.gapSince))
  setOrDelete(s, fields, deleted, 'handOffAt', s.handOffAt and int(s.handOffAt))
  setOrDelete(s, fields, deleted, 'holder', s.holder)
  setOrDelete(s, fields, deleted, 'until', s.leaseUntil and int(s.leaseUntil))
  -- Where a closed key closed (see rsq-resolve-3's close): set once, never removed.
  if s.closedFrom then
    fields[#fields + 1] = 'closedFrom'
    fields[#fields + 1] = int(s.closedFrom)
  end
  -- The token of the settle that made this change, if one did (see rsq-settle-3).
  if s.settled then
    fields[#fields + 1] = 'settled'
    fields[#fields + 1] = s.settled
  end
  if #deleted > 0 then
    rcall('HDEL', stateKey, unpack(deleted))
  end
  rcall('HSET', stateKey, unpack(fields))
  local ttl = retentionMs + math.floor(retentionMs / 10)
  if renew then
    rcall('PEXPIRE', stateKey, ttl)
  end
  if renew or s.createdBuffer then
    rcall('PEXPIRE', bufferKey, ttl)
  end
  if renew or s.createdHandOff then
    rcall('PEXPIRE', handOffKey, ttl)
  end
end

local function lowestBuffered()
  local head = rcall('ZRANGE', bufferKey, 0, 0, 'WITHSCORES')
  return tonumber(head[2])
end

-- The key's index record. The scope index needs a key while it has buffered events (gaps,
-- total) or a tracked hand-off (items a gap resolution appended, which no unacked input message
-- covers: the sweeper drains them if their drainer dies). Unless `force`, a key that needs none
-- gets {} (no index step): a key whose events come in order costs no index work. `buffered`:
-- the buffer's size, when the caller knows it (else it is read).
local function indexRecordIf(s, force, buffered)
  if not s.next then
    return {}
  end
  buffered = buffered or rcall('ZCARD', bufferKey)
  if not force and not s.reset and buffered == 0 and not s.track then
    return {}
  end
  return {s.ver, buffered, s.next, lowestBuffered() or -1, s.gapSince or -1,
    s.alerted and 1 or 0, s.track and s.handOffAt or -1, s.at, buffered > 0 and s.bufBytes or 0}
end

-- The bytes an event counts for against the byte bounds (heldEntryBytes on the client, which
-- writes them first in the entry, as "n"); an entry without them counts its stored length.
local function entryBytes(entry)
  return tonumber(string.match(entry, '^{"n":(%d+),')) or #entry
end

-- The bytes a hand-off item holds: its event's ('e', 'd'), none for a gap record.
local function itemBytes(item)
  local kind = string.sub(item, 1, 1)
  if kind == 'e' then
    return tonumber(string.match(item, '^e{"n":(%d+),')) or #item - 1
  elseif kind == 'd' then
    return tonumber(string.match(item, '^d%d+:{"n":(%d+),')) or #item
  end
  return 0
end

-- Takes `count` items off the head of the hand-off list, and their bytes off s.hoBytes. Returns
-- how many items are left. The usual settle takes the whole list: deleted, its items unread.
local function trimHandOff(s, count)
  local listed = rcall('LLEN', handOffKey)
  if count >= listed then
    rcall('DEL', handOffKey)
    s.hoBytes = 0
    return 0
  end
  local bytes = 0
  for _, item in ipairs(rcall('LRANGE', handOffKey, 0, count - 1)) do
    bytes = bytes + itemBytes(item)
  end
  rcall('LTRIM', handOffKey, count, -1)
  s.hoBytes = math.max(0, s.hoBytes - bytes)
  return listed - count
end

local function indexRecord(s, buffered)
  return indexRecordIf(s, true, buffered)
end

-- What a script that changed nothing returns to repair the key's index entry: its record, or for
-- a retired key {ver}, which tells the caller to drop the key's index entries up to that ver
-- (rsq-unindex-5): a step a retirement overtook (another instance's, delayed) may have put back
-- the entries its retirement removed (see rsq-retire-3).
local function repairRecord(s, now)
  if s.retireAt then
    return {s.ver}
  end
  if not s.next and now then
    -- No state (lost, or expired just now): whatever the index still holds for the key is stale
    -- (a gap, buffered events, a stalled hand-off nobody can resolve); drop it, or every sweep
    -- lists it again until retention, ahead of the live keys. Only records older than the
    -- callers' clock tolerance: on Redis Cluster the drop is a second step, and a key another
    -- instance recreated meanwhile must keep its record (a later sweep drops what is left).
    return {math.max(s.ver, now - CLOCK_TOLERANCE_MS)}
  end
  return indexRecord(s)
end

-- Writes a drain claim (s.holder and s.leaseUntil set by the caller). A claim is activity: a key
-- its drainers keep claiming must not expire under them with its hand-off items undelivered and
-- its `next` lost, so `at` moves to `now`. When the TTLs are due for renewal, the claim is saved
-- as a change (TTLs renewed) and returns the key's index record, whose activity entry moves too;
-- else it writes the lease and `at` only, and returns nil.
local function saveClaim(s, now, retentionMs)
  if not s.ttlAt or now - s.ttlAt >= retentionMs / 10 or s.retireAt then
    saveState(s, now, retentionMs)
    return indexRecord(s)
  end
  s.at = math.max(s.at, now)
  rcall('HSET', stateKey, 'holder', s.holder, 'until', int(s.leaseUntil), 'at', int(s.at))
  return nil
end

-- Call before appending to the hand-off list: an empty list starts its stall clock now (and is
-- created by the append: it needs its TTL).
local function beforeAppend(s, now)
  if rcall('LLEN', handOffKey) == 0 then
    s.handOffAt = now
    s.createdHandOff = true
  end
end

local BATCH = 100

-- Moves the contiguous run at the head of the buffer that starts at s.next to the hand-off
-- list (as events) and advances s.next past it. Returns how many events moved.
local function releaseRun(s)
  local moved = 0
  while true do
    local head = rcall('ZRANGE', bufferKey, 0, BATCH - 1, 'WITHSCORES')
    local items = {}
    for i = 1, #head, 2 do
      if tonumber(head[i + 1]) ~= s.next then
        break
      end
      items[#items + 1] = 'e' .. head[i]
      s.next = s.next + 1
      local bytes = entryBytes(head[i])
      s.bufBytes, s.hoBytes = s.bufBytes - bytes, s.hoBytes + bytes
    end
    if #items > 0 then
      rcall('RPUSH', handOffKey, unpack(items))
      rcall('ZREMRANGEBYRANK', bufferKey, 0, #items - 1)
      moved = moved + #items
    end
    if #items < BATCH then
      return moved
    end
  end
end

-- After a release: what is left in the buffer waits behind a new gap, opened now. Returns the
-- buffer's size.
local function afterRelease(s, now)
  local left = rcall('ZCARD', bufferKey)
  if left > 0 then
    s.gapSince = now
  else
    s.gapSince, s.bufBytes = nil, 0
  end
  s.alerted = false
  return left
end
