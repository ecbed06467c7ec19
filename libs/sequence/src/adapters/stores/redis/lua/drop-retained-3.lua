--[[
  drop-retained: drops the fragments a 'failed' finish kept, once their retention is over or to
  make room in the budget. The marker stays. Only the retention the index knows (by its until)
  is dropped: a newer one is left alone.

  KEYS[1] meta, KEYS[2] crc, KEYS[3] body
  ARGV[1] retainUntil, as the index holds it

  Returns 1 when fragments were dropped, 0 otherwise.
]]
--- @include "_sequence"

local metaKey, crcKey, bodyKey = KEYS[1], KEYS[2], KEYS[3]
local meta = redis.call('HMGET', metaKey, 'state', 'retainUntil')
if meta[1] ~= 'failed' or meta[2] ~= ARGV[1] then
  return 0
end
dropSequence(metaKey, crcKey, bodyKey)
return 1
