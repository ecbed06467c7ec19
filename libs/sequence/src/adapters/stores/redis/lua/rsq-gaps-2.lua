--[[
  rsq-gaps: the open gaps of a scope (the resequencer store's `listGaps`); read-only.

  KEYS[1] gaps      zset   key -> gapSince for open gaps not alerted yet (due once old enough),
                           gapSince + 2^50 for open gaps already alerted (never due again)
  KEYS[2] records   hash   key -> index record "ver:buffered:next:lowest:bytes"

  ARGV[1] openedBefore (ms)      ARGV[2] limit
  ARGV[3] 1: alerted gaps too, 0: only those not alerted (what a sweep resolves)

  Returns a flat list, oldest gap first (then by key, in byte order), at most limit entries:
  key, gapSince, record | false, alerted (1 | 0), ...
]]
--- @include "_clock"
local rcall = redis.call
local gapsKey, recordsKey = KEYS[1], KEYS[2]
--- @include "_rsq-gap-score"

local openedBefore, limit = callerTime(ARGV[1]), tonumber(ARGV[2])

-- Alerted gaps start at ALERTED_GAP_OFFSET: a due range never reaches them.
local latest = math.min(openedBefore, ALERTED_GAP_OFFSET - 1)
local due = rcall('ZRANGEBYSCORE', gapsKey, '-inf', scoreText(latest), 'WITHSCORES', 'LIMIT', 0,
  limit)
local alerted = {}
if ARGV[3] == '1' then
  alerted = rcall('ZRANGEBYSCORE', gapsKey, scoreText(ALERTED_GAP_OFFSET),
    scoreText(latest + ALERTED_GAP_OFFSET), 'WITHSCORES', 'LIMIT', 0, limit)
end

local reply, i, j, n = {}, 1, 1, 0
while n < limit and (i <= #due or j <= #alerted) do
  local dueSince = due[i] and tonumber(due[i + 1])
  local alertedSince = alerted[j] and tonumber(alerted[j + 1]) - ALERTED_GAP_OFFSET
  local key, since, flag
  if dueSince and (not alertedSince or dueSince < alertedSince
      or (dueSince == alertedSince and beforeKey(due[i], alerted[j]))) then
    key, since, flag = due[i], dueSince, 0
    i = i + 2
  else
    key, since, flag = alerted[j], alertedSince, 1
    j = j + 2
  end
  reply[#reply + 1] = key
  reply[#reply + 1] = since
  reply[#reply + 1] = rcall('HGET', recordsKey, key)
  reply[#reply + 1] = flag
  n = n + 1
end
return reply
