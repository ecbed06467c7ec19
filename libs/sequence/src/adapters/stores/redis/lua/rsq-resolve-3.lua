--[[
  rsq-resolve: applies a gap policy to a key (the resequencer store's `resolveGap`), only if the
  key still has a gap opened at or before openedBefore (and, for 'alert', not alerted yet): of
  several sweepers that listed the same gap, one resolves it.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] policy: 'alert' | 'skip' | 'dead-letter'
  ARGV[3] openedBefore (ms)                 ARGV[4] retention ms

  Returns {code, record, ...} (record: see _resequencer):
    'none', record
    'resolved', record, appended (hand-off items appended)
]]
--- @include "_resequencer"

local now, policy, openedBefore = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local retentionMs = tonumber(ARGV[4])

local s = loadState(now, retentionMs)
local size = rcall('ZCARD', bufferKey)
if not s.next or size == 0 or not s.gapSince or s.gapSince > openedBefore or
    (policy == 'alert' and s.alerted) then
  return {'none', indexRecord(s)}
end

beforeAppend(s, now)
local appended
if policy == 'alert' then
  rcall('RPUSH', handOffKey, 'a' .. int(s.next) .. ':' .. int(size) .. ':' .. int(s.gapSince))
  s.alerted = true
  appended = 1
elseif policy == 'skip' then
  local lowest = lowestBuffered()
  rcall('RPUSH', handOffKey, 's' .. int(s.next) .. ':' .. int(lowest - 1))
  s.next = lowest
  appended = 1 + releaseRun(s)
  afterRelease(s, now)
elseif policy == 'dead-letter' then
  local expected, highest = int(s.next), s.next
  while true do
    local head = rcall('ZRANGE', bufferKey, 0, BATCH - 1, 'WITHSCORES')
    if #head == 0 then
      break
    end
    local items = {}
    for i = 1, #head, 2 do
      items[#items + 1] = 'd' .. expected .. ':' .. head[i]
      highest = tonumber(head[i + 1])
    end
    rcall('RPUSH', handOffKey, unpack(items))
    rcall('ZREMRANGEBYRANK', bufferKey, 0, #items - 1)
  end
  s.next = highest + 1
  s.gapSince, s.alerted = nil, false
  appended = size
else
  return redis.error_reply('unknown gap policy ' .. policy)
end
saveState(s, now, retentionMs)
return {'resolved', indexRecord(s), appended}
