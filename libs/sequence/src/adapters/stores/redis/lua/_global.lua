--[[
  Helpers shared by the global-slot scripts (textually included by the script loader). These
  keys share the hash tag {idx}, one slot for the whole store:
    KEYS[1] open       hash  member -> budget record "epoch:claim:ver:storedBytes"
    KEYS[2] due        zset  member -> when the sweeper may take it (logical ms)
    KEYS[3] first      zset  member -> first fragment time (oldestOpenAt)
    KEYS[4] retention  zset  member -> until when a failed sequence's fragments are kept
    KEYS[5] retained   hash  member -> "retainUntil:bytes"
    KEYS[6] totals     hash  claimed, stored, retained (sums of the above), epoch (counter),
                             c:<scope> (claimed by the scope's records)
]]
local rcall = redis.call
local openKey, dueKey, firstKey = KEYS[1], KEYS[2], KEYS[3]
local retentionKey, retainedKey, totalsKey = KEYS[4], KEYS[5], KEYS[6]

local function int(n)
  return string.format('%d', n)
end

local function readRecord(member)
  local raw = rcall('HGET', openKey, member)
  if not raw then
    return nil
  end
  local epoch, claim, ver, stored = string.match(raw, '^(%d+):(%d+):(%d+):(%d+)$')
  return {epoch = tonumber(epoch), claim = tonumber(claim), ver = tonumber(ver),
    stored = tonumber(stored)}
end

local function writeRecord(member, r)
  rcall('HSET', openKey, member,
    int(r.epoch) .. ':' .. int(r.claim) .. ':' .. int(r.ver) .. ':' .. int(r.stored))
end

-- The hash each sum adds up. The totals hash can outlive it: when every consumer is away for
-- longer than the keys' TTLs, the index expires with the sequences it counts, while the totals,
-- renewed with the longest TTL, stay. A sum whose hash is gone is zero.
local SUMMED = {claimed = openKey, stored = openKey, retained = retainedKey}

local function total(field)
  if rcall('EXISTS', SUMMED[field]) == 0 then
    return 0
  end
  return tonumber(rcall('HGET', totalsKey, field)) or 0
end

-- The totals field of the budget a scope's records claim (a member is <scope>:<sequence id>,
-- its scope percent-encoded: no ':' in it).
local function scopeField(member)
  return 'c:' .. string.match(member, '^([^:]*):')
end

-- Called first by every script that changes a sum: drops the sums whose hash is gone.
local function dropOrphanedTotals()
  if rcall('EXISTS', openKey) == 0 then
    rcall('HDEL', totalsKey, 'claimed', 'stored')
    for _, field in ipairs(rcall('HKEYS', totalsKey)) do
      if string.sub(field, 1, 2) == 'c:' then
        rcall('HDEL', totalsKey, field)
      end
    end
  end
  if rcall('EXISTS', retainedKey) == 0 then
    rcall('HDEL', totalsKey, 'retained')
  end
end

local function addTotal(field, delta)
  if delta ~= 0 then
    rcall('HINCRBY', totalsKey, field, int(delta))
  end
end

-- Budget claimed by the records of the member's scope.
local function scopeClaimed(member)
  if rcall('EXISTS', openKey) == 0 then
    return 0
  end
  return tonumber(rcall('HGET', totalsKey, scopeField(member))) or 0
end

-- Adds delta to the budget claimed, store-wide and by the member's scope.
local function addClaim(member, delta)
  if delta == 0 then
    return
  end
  addTotal('claimed', delta)
  local field = scopeField(member)
  if tonumber(rcall('HINCRBY', totalsKey, field, int(delta))) <= 0 then
    rcall('HDEL', totalsKey, field)
  end
end

-- Removes a record and its index entries, and takes its bytes off the totals.
local function dropRecord(member, r)
  rcall('HDEL', openKey, member)
  rcall('ZREM', dueKey, member)
  rcall('ZREM', firstKey, member)
  addClaim(member, -r.claim)
  addTotal('stored', -r.stored)
end

local function parseRetained(raw)
  local untilAt, bytes = string.match(raw, '^(%d+):(%d+)$')
  return tonumber(untilAt), tonumber(bytes)
end

-- Every global key lives at least as long as the sequence keys it accounts for.
local function extendAll(ttl)
  for i = 1, 6 do
    local current = rcall('PTTL', KEYS[i])
    if current ~= -2 and current < ttl then
      rcall('PEXPIRE', KEYS[i], ttl)
    end
  end
end
