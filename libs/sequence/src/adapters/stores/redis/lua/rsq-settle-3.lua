--[[
  rsq-settle: the lease holder removes the items it delivered from the head of the hand-off
  list and gets the next ones (the resequencer store's `settleDrain`). Only the lease decides:
  a holder whose lease ran out still settles while nobody has taken it over.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] holder      ARGV[3] count (items delivered, >= 1)
  ARGV[4] lease ms      ARGV[5] limit (most items returned)     ARGV[6] retention ms

  Returns {code, record, ...} (record: see _resequencer):
    'lost', record              the holder no longer holds the lease: nothing trimmed
    'empty', record             the list is empty now: the lease is released
    'claimed', record, items... the lease renewed until now + lease ms, and the next items
]]
--- @include "_resequencer"

local now, holder, count = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local leaseMs, limit, retentionMs = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

local s = loadState(now, retentionMs)
if not s.next or s.holder ~= holder then
  return {'lost', indexRecord(s)}
end

rcall('LTRIM', handOffKey, count, -1)
if rcall('LLEN', handOffKey) == 0 then
  s.holder, s.leaseUntil, s.handOffAt = nil, nil, nil
  saveState(s, now, retentionMs)
  return {'empty', indexRecord(s)}
end
-- Progress: the stall clock restarts.
s.handOffAt, s.leaseUntil = now, now + leaseMs
saveState(s, now, retentionMs)
local reply = rcall('LRANGE', handOffKey, 0, limit - 1)
table.insert(reply, 1, indexRecord(s))
table.insert(reply, 1, 'claimed')
return reply
