--[[
  rsq-expiring: the open gaps of a scope, alerted or not, whose key has not changed for nine
  tenths of the retention and has not expired yet (the resequencer store's `listExpiringGaps`);
  read-only. The sweeper dead-letters their events before retention would delete them.

  KEYS[1] gaps      zset   see rsq-gaps
  KEYS[2] records   hash   see rsq-gaps
  KEYS[3] activity  zset   key -> its last indexed change (the state's `at`)

  ARGV[1] now (ms)      ARGV[2] retention ms      ARGV[3] limit

  The activity zset is walked from the oldest live change up (at most SCAN members a call): the
  keys closest to expiry come first, and those ahead of a key leave the range as they expire, so
  a key waiting behind many idle keys without a gap is reached before its own expiry.

  Returns a flat list, least recently changed first (then by key, in byte order), at most limit
  entries: key, gapSince, record, alerted (1 | 0), changedAt, ...
]]
--- @include "_clock"
local rcall = redis.call
local gapsKey, recordsKey, activityKey = KEYS[1], KEYS[2], KEYS[3]
--- @include "_rsq-gap-score"

local SCAN = 1000

local now, retentionMs, limit = callerTime(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local idleSince = now - retentionMs + math.floor(retentionMs / 10)
local expiredAt = now - retentionMs

local reply, n = {}, 0
local idle = rcall('ZRANGEBYSCORE', activityKey, '(' .. scoreText(expiredAt), scoreText(idleSince),
  'WITHSCORES', 'LIMIT', 0, SCAN)
for i = 1, #idle, 2 do
  if n >= limit then
    break
  end
  local key = idle[i]
  local score = tonumber(rcall('ZSCORE', gapsKey, key))
  if score then
    local record = rcall('HGET', recordsKey, key)
    if record then
      local alerted = score >= ALERTED_GAP_OFFSET
      reply[#reply + 1] = key
      reply[#reply + 1] = alerted and score - ALERTED_GAP_OFFSET or score
      reply[#reply + 1] = record
      reply[#reply + 1] = alerted and 1 or 0
      reply[#reply + 1] = tonumber(idle[i + 1])
      n = n + 1
    end
  end
end
return reply
