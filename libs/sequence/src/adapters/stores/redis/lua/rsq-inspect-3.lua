--[[
  rsq-inspect: a key's state as it is stored (the resequencer store's `inspect`); read-only.

  KEYS: see _resequencer (state, buffer, handoff)

  Returns {next | false, gapSince | false, hand-off length, {buffered sequences, ascending},
  held bytes (of the buffer's and the hand-off list's events)}.
]]
local rcall = redis.call
local stateKey, bufferKey, handOffKey = KEYS[1], KEYS[2], KEYS[3]

local state = rcall('HMGET', stateKey, 'next', 'gapSince', 'bufBytes', 'hoBytes')
local sequences = {}
local from = 0
while true do
  -- Members are whole entries: read in batches, keep only the scores.
  local page = rcall('ZRANGE', bufferKey, from, from + 99, 'WITHSCORES')
  for i = 2, #page, 2 do
    sequences[#sequences + 1] = tonumber(page[i])
  end
  if #page < 200 then
    break
  end
  from = from + 100
end
local heldBytes = 0
if state[1] then
  heldBytes = (tonumber(state[3]) or 0) + (tonumber(state[4]) or 0)
end
return {state[1], state[2], rcall('LLEN', handOffKey), sequences, heldBytes}
