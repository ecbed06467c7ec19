--[[
  rsq-gap-stats: how many keys of a scope wait on a gap, and how long the oldest has waited (the
  resequencer store's `gapStats`, read by a gauge at every scrape). First drops the records of
  keys past their retention, as rsq-prune does, so that an abandoned key's gap is not reported
  for days. A few commands whatever the number of keys: ZCARD and two one-element ranges.

  KEYS[1..5] the scope's index keys (see rsq-index-5)

  ARGV[1] now (ms)      ARGV[2] retention ms      ARGV[3] most records dropped

  Returns {open gaps, age of the oldest in ms | -1 when there is none}.
]]
--- @include "_clock"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"

local now = callerTime(ARGV[1])
pruneIndex(KEYS, now - tonumber(ARGV[2]), tonumber(ARGV[3]))

local gapsKey = KEYS[2]
local count = redis.call('ZCARD', gapsKey)
if count == 0 then
  return {0, -1}
end
-- The oldest gap not alerted is the lowest score; the oldest alerted one the lowest score at or
-- above ALERTED_GAP_OFFSET.
local oldest
local due = redis.call('ZRANGEBYSCORE', gapsKey, '-inf', scoreText(ALERTED_GAP_OFFSET - 1),
  'WITHSCORES', 'LIMIT', 0, 1)
if due[2] then
  oldest = tonumber(due[2])
end
local alerted = redis.call('ZRANGEBYSCORE', gapsKey, scoreText(ALERTED_GAP_OFFSET), '+inf',
  'WITHSCORES', 'LIMIT', 0, 1)
if alerted[2] then
  local since = tonumber(alerted[2]) - ALERTED_GAP_OFFSET
  if not oldest or since < oldest then
    oldest = since
  end
end
return {count, math.max(0, now - oldest)}
