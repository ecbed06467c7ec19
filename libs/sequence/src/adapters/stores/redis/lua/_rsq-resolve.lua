-- The body of rsq-resolve (see rsq-resolve-3.lua for KEYS, ARGV and returns), as a function, so that
-- the single-node variant rsq-resolve-ix-8 can apply the scope index inline after it.
local function resolveStep()
  local now, policy, openedBefore = callerTime(ARGV[1]), ARGV[2], callerTime(ARGV[3])
  local retentionMs = tonumber(ARGV[4])
  -- Compared with the stored `at` as it is: it was read from the index, on the stored clock.
  local unchangedSince = tonumber(ARGV[5])

  local s = loadState(now, retentionMs)
  local size = rcall('ZCARD', bufferKey)
  if not s.next or size == 0 or not s.gapSince or s.gapSince > openedBefore or
      (policy == 'alert' and s.alerted) or (unchangedSince and s.at > unchangedSince) then
    return {'none', repairRecord(s, now)}
  end

  beforeAppend(s, now)
  local appended, skipped
  if policy == 'alert' then
    rcall('RPUSH', handOffKey, 'a' .. int(s.next) .. ':' .. int(size) .. ':' .. int(s.gapSince))
    s.alerted = true
    appended = 1
  elseif policy == 'skip' then
    local lowest = lowestBuffered()
    rcall('RPUSH', handOffKey, 's' .. int(s.next) .. ':' .. int(lowest - 1))
    skipped = {s.next, lowest - 1, s.gapSince}
    s.next = lowest
    appended = 1 + releaseRun(s)
    afterRelease(s, now)
  elseif policy == 'dead-letter' then
    local expected, highest, missing = int(s.next), s.next, s.next
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
    if ARGV[6] == '1' then
      s.closedFrom = missing
      s.next = {{CLOSED_KEY_NEXT}}
    end
    s.gapSince, s.alerted = nil, false
    s.hoBytes, s.bufBytes = s.hoBytes + s.bufBytes, 0
    appended = size
  else
    return redis.error_reply('unknown gap policy ' .. policy)
  end
  s.track = true -- appended items no input message covers: the index lists them when stalled
  saveState(s, now, retentionMs)
  if skipped then
    return {'resolved', indexRecord(s), appended, skipped[1], skipped[2], skipped[3]}
  end
  return {'resolved', indexRecord(s), appended}
end
