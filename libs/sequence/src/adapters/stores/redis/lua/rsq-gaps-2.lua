--[[
  rsq-gaps: the open gaps of a scope that are due (the resequencer store's `listGaps`); read-only.

  KEYS[1] gaps      zset   key -> gapSince (open gaps not alerted yet)
  KEYS[2] records   hash   key -> index record "ver:buffered:next:lowest"

  ARGV[1] openedBefore (ms)      ARGV[2] limit

  Returns a flat list, oldest gap first: key, gapSince, record | false, ...
]]
local rcall = redis.call
local gapsKey, recordsKey = KEYS[1], KEYS[2]

local due = rcall('ZRANGEBYSCORE', gapsKey, '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local reply = {}
for i = 1, #due, 2 do
  reply[#reply + 1] = due[i]
  reply[#reply + 1] = due[i + 1]
  reply[#reply + 1] = rcall('HGET', recordsKey, due[i])
end
return reply
