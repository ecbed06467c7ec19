--[[
  rsq-index: the scope-index step that follows every per-key script (a script runs in one slot,
  and a scope's index lives in a slot of its own). Applies a key's index record unless a newer
  one (higher ver) was applied already: idempotent, and safe whatever order two instances'
  records arrive in. First prunes records of keys past their retention, so that their buffered
  events leave the total and their gaps and hand-offs are no longer listed.

  KEYS[1] records   hash   key -> "ver:buffered:next:lowest"
  KEYS[2] gaps      zset   key -> gapSince, for gaps open and not alerted
  KEYS[3] stalled   zset   key -> handOffAt, for hand-off lists not empty
  KEYS[4] activity  zset   key -> at (time of its last indexed change)
  KEYS[5] total     string events buffered in the scope (sum of the records' buffered)

  ARGV[1] key        ARGV[2] ver         ARGV[3] buffered     ARGV[4] next
  ARGV[5] lowest | -1                    ARGV[6] gapSince | -1          ARGV[7] alerted (1 | 0)
  ARGV[8] handOffAt | -1                 ARGV[9] at           ARGV[10] now (ms)
  ARGV[11] retention ms                  ARGV[12] TTL of the index keys (ms)
  ARGV[13] most expired records pruned by this call

  Returns the scope's buffered total after the call.
]]
local rcall = redis.call
local recordsKey, gapsKey, stalledKey, activityKey, totalKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local member, ver, buffered = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local gapSince, alerted, handOffAt = tonumber(ARGV[6]), ARGV[7] == '1', tonumber(ARGV[8])
local at, now, retentionMs = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local ttl, pruneBatch = tonumber(ARGV[12]), tonumber(ARGV[13])
local cutoff = now - retentionMs

local function parse(raw)
  local storedVer, storedBuffered = string.match(raw, '^(%d+):(%d+):')
  return tonumber(storedVer), tonumber(storedBuffered)
end

local function drop(name)
  local raw = rcall('HGET', recordsKey, name)
  if raw then
    local _, storedBuffered = parse(raw)
    if storedBuffered > 0 then
      rcall('DECRBY', totalKey, storedBuffered)
    end
    rcall('HDEL', recordsKey, name)
  end
  rcall('ZREM', gapsKey, name)
  rcall('ZREM', stalledKey, name)
  rcall('ZREM', activityKey, name)
end

-- A key whose last change is retentionMs old is gone (the per-key scripts treat it as absent).
for _, name in ipairs(rcall('ZRANGEBYSCORE', activityKey, '-inf', cutoff, 'LIMIT', 0, pruneBatch)) do
  drop(name)
end
local lastSeen = tonumber(rcall('ZSCORE', activityKey, member))
if lastSeen and lastSeen <= cutoff then
  drop(member)
end

local raw = rcall('HGET', recordsKey, member)
local storedVer, storedBuffered = 0, 0
if raw then
  storedVer, storedBuffered = parse(raw)
end
if at > cutoff and (not raw or ver >= storedVer) then
  if buffered ~= storedBuffered then
    rcall('INCRBY', totalKey, buffered - storedBuffered)
  end
  rcall('HSET', recordsKey, member, ARGV[2] .. ':' .. ARGV[3] .. ':' .. ARGV[4] .. ':' .. ARGV[5])
  if gapSince >= 0 and not alerted then
    rcall('ZADD', gapsKey, gapSince, member)
  else
    rcall('ZREM', gapsKey, member)
  end
  if handOffAt >= 0 then
    rcall('ZADD', stalledKey, handOffAt, member)
  else
    rcall('ZREM', stalledKey, member)
  end
  rcall('ZADD', activityKey, at, member)
end

for i = 1, 5 do
  rcall('PEXPIRE', KEYS[i], ttl)
end
return tonumber(rcall('GET', totalKey)) or 0
