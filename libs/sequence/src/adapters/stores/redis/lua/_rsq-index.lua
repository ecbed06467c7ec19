--[[
  The scope-index step as a function, shared by rsq-index-5 (the second step, on Redis Cluster)
  and the single-node "-ix" variants of the per-key scripts, which apply it inline. See
  rsq-index-5.lua for what it does. Include _rsq-gap-score before it. Also the pruning of expired
  keys' records, which rsq-prune-5 runs on its own.

  ik: the index keys {records, gaps, stalled, activity, total}; member: the key's name;
  r: the key's index record {ver, buffered, next, lowest, gapSince, alerted, handOffAt, at,
  bufBytes}.
  applyIndex returns the scope's buffered totals after the call: {events, bytes}.

  The records hash also holds, under the empty field (no key has an empty name), the scope's
  buffered bytes: the sum of the records' bytes (a record written without them counts none).
]]
local BYTES_FIELD = ''

local function parseIndexRecord(raw)
  local storedVer, storedBuffered = string.match(raw, '^(%d+):(%d+):')
  local storedBytes = string.match(raw, '^%d+:%d+:%d+:%-?%d+:(%d+)$')
  return tonumber(storedVer), tonumber(storedBuffered), tonumber(storedBytes) or 0
end

-- The scope's buffered events and bytes as this script call last read or changed them (nil: not
-- read yet). Only the functions here change them, each through a command that answers the new
-- value, and a call works on one scope: a batch call reads them at most once, not per step.
local knownEvents, knownBytes

-- The scope's buffered events and bytes.
local function indexTotals(ik)
  if knownEvents == nil then
    knownEvents = tonumber(redis.call('GET', ik[5])) or 0
  end
  if knownBytes == nil then
    knownBytes = tonumber(redis.call('HGET', ik[1], BYTES_FIELD)) or 0
  end
  return {knownEvents, knownBytes}
end

-- Set by the batch scripts: the totals' changes of the call's steps are summed (pendingEvents,
-- pendingBytes; knownEvents and knownBytes include them) and written once, by flushTotals,
-- instead of one INCRBY and one HINCRBY per step.
local deferTotals = false
local pendingEvents, pendingBytes = 0, 0

-- Adds to the scope's buffered totals; `created` (optional) gets the total key if this may have
-- created it.
local function addToTotals(ik, events, bytes, created)
  if deferTotals then
    indexTotals(ik)
    knownEvents, knownBytes = knownEvents + events, knownBytes + bytes
    pendingEvents, pendingBytes = pendingEvents + events, pendingBytes + bytes
    return
  end
  if events ~= 0 then
    knownEvents = redis.call('INCRBY', ik[5], events)
    if created and knownEvents == events then
      created[#created + 1] = ik[5]
    end
  end
  if bytes ~= 0 then
    knownBytes = redis.call('HINCRBY', ik[1], BYTES_FIELD, bytes)
  end
end

-- Writes the changes deferTotals held back (a batch script calls it before it returns). `ttl`:
-- the index TTL; a total key this may create gets its TTL, as in applyIndex.
local function flushTotals(ik, ttl)
  if pendingEvents ~= 0 and redis.call('INCRBY', ik[5], pendingEvents) == pendingEvents then
    redis.call('PEXPIRE', ik[5], ttl + math.floor(ttl / 10))
  end
  if pendingBytes ~= 0 then
    redis.call('HINCRBY', ik[1], BYTES_FIELD, pendingBytes)
  end
  pendingEvents, pendingBytes = 0, 0
end

-- A batch script's steps: take(1), ..., take(count), then the totals they changed. When a step
-- fails, the steps before it stand (the client tries each item alone), and so do their totals.
local function runBatch(count, take, ik, ttl)
  for i = 1, count do
    local ok, failure = pcall(take, i)
    if not ok then
      flushTotals(ik, ttl)
      error(failure)
    end
  end
  flushTotals(ik, ttl)
end

-- Whether this call has seen the activity key's TTL at or above the index TTL (or renewed every
-- index key's): script time stands still, so one PTTL a call is enough.
local indexTtlFresh = false

-- Removes a key from the index, taking its buffered events and bytes off the totals.
local function dropIndexed(ik, name)
  local raw = redis.call('HGET', ik[1], name)
  if raw then
    local _, storedBuffered, storedBytes = parseIndexRecord(raw)
    addToTotals(ik, -storedBuffered, -storedBytes)
    redis.call('HDEL', ik[1], name)
  end
  redis.call('ZREM', ik[2], name)
  redis.call('ZREM', ik[3], name)
  redis.call('ZREM', ik[4], name)
end

-- Removes a key from the index unless its record there is newer than `ver` (a change of the key
-- that came after what the caller saw).
local function dropIndexedUpTo(ik, name, ver)
  local raw = redis.call('HGET', ik[1], name)
  if not raw then
    return
  end
  local storedVer = parseIndexRecord(raw)
  if storedVer <= ver then
    dropIndexed(ik, name)
  end
end

-- Drops at most `batch` keys whose last indexed change is at or before `cutoff`, except `keep`.
local function pruneIndex(ik, cutoff, batch, keep)
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', ik[4], '-inf', cutoff, 'LIMIT', 0, batch)) do
    if name ~= keep then
      dropIndexed(ik, name)
    end
  end
end

local function applyIndex(ik, member, r, now, retentionMs, ttl, pruneBatch)
  local recordsKey, gapsKey, stalledKey, activityKey = ik[1], ik[2], ik[3], ik[4]
  local ver, buffered = r[1], r[2]
  local gapSince, alerted, handOffAt, at = r[5], r[6] == 1, r[7], r[8]
  local cutoff = now - retentionMs
  -- TTLs: every index key lives at least `ttl` after the last step. PEXPIRE on all five keys at
  -- every step cost a third of the step: they are set for ttl + ttl / 10 and renewed together
  -- once the activity key's TTL has fallen below ttl (one PTTL a step); a key that this step may
  -- have created (a new field or member, a counter that was zero) gets its TTL at once, so none
  -- is left without one. Each key's TTL thus never ends before the activity key's.
  local longTtl = ttl + math.floor(ttl / 10)
  local created = {}

  -- Keys whose last change is retentionMs old are gone (the per-key scripts treat them as
  -- absent): they are pruned when a key enters the index (it has no record), and on about one call
  -- in 16 otherwise: the scan on every call cost as much as the rest of the step. The key's own
  -- record, if it is one of them, is replaced below as if it had been dropped first: the totals
  -- move by the difference, and its gap, hand-off and activity entries are all rewritten.
  local raw = redis.call('HGET', recordsKey, member)
  if not raw or now % 16 == 0 then
    pruneIndex(ik, cutoff, pruneBatch, member)
  end
  local storedVer, storedBuffered, storedBytes = 0, 0, 0
  if raw then
    storedVer, storedBuffered, storedBytes = parseIndexRecord(raw)
  end
  if at > cutoff and (not raw or ver >= storedVer) then
    local bytes = r[9] or 0
    addToTotals(ik, buffered - storedBuffered, bytes - storedBytes, created)
    if redis.call('HSET', recordsKey, member,
        string.format('%d:%d:%d:%d:%d', r[1], r[2], r[3], r[4], bytes)) > 0 then
      created[#created + 1] = recordsKey
    end
    -- Every open gap is indexed, an alerted one above any time a sweep asks for (_rsq-gap-score),
    -- so that instances that predate alerted entries read the same due gaps.
    if gapSince >= 0 then
      local score = alerted and gapSince + ALERTED_GAP_OFFSET or gapSince
      if redis.call('ZADD', gapsKey, scoreText(score), member) > 0 then
        created[#created + 1] = gapsKey
      end
    else
      redis.call('ZREM', gapsKey, member)
    end
    if handOffAt >= 0 then
      if redis.call('ZADD', stalledKey, handOffAt, member) > 0 then
        created[#created + 1] = stalledKey
      end
    else
      redis.call('ZREM', stalledKey, member)
    end
    if redis.call('ZADD', activityKey, at, member) > 0 then
      created[#created + 1] = activityKey
    end
  end

  if not indexTtlFresh and redis.call('PTTL', activityKey) < ttl then
    for i = 1, 5 do
      redis.call('PEXPIRE', ik[i], longTtl)
    end
  else
    for _, name in ipairs(created) do
      redis.call('PEXPIRE', name, longTtl)
    end
  end
  indexTtlFresh = true
  return indexTotals(ik)
end
