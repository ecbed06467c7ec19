--[[
  claim-complete: marks one consumer group done with one ticket and counts the ticket's
  completed groups (the claim ledger's `complete`). The completion ends the group's lease,
  whoever holds it: every later claim of the group answers 'done'.

  KEYS[1] done    hash    group -> retainUntil (ms): the ticket's completed groups
  KEYS[2] lease   hash    {holder, until}: this group's lease on the ticket

  ARGV[1] group            ARGV[2] retainUntil (ms) ARGV[3] now (ms)
  ARGV[4] key TTL margin ms

  Returns {groups, first}: groups is the number of completed groups still retained at now (this
  one included), first 1 when this call marked the group done, 0 when it already was (its
  retainUntil becomes the later of the two). Groups past their retention by more than the margin
  are removed first: until then, a claimant whose clock runs behind (by up to the margin) still
  finds them (claim-acquire). The done key lives until the latest retainUntil of its groups, plus
  the margin.
]]
--- @include "_clock"
local rcall = redis.call
local doneKey, leaseKey = KEYS[1], KEYS[2]
local group = ARGV[1]
local now, margin = callerTime(ARGV[3]), tonumber(ARGV[4])
-- retainUntil comes from the ticket's expiresAt, which each instance checks on its own clock: it
-- counts until it is past on both clocks, so it is moved onto Redis's only when that makes it
-- later (a caller behind). Made earlier (a caller ahead), the completion would be gone before an
-- in-sync instance takes the ticket for expired, and that one would handle a duplicate again.
local retainUntil = math.max(callerTime(ARGV[2]), tonumber(string.match(ARGV[2], '^[^:]+')))

rcall('DEL', leaseKey)

local groups, first, latest = 0, 1, retainUntil
local fields = rcall('HGETALL', doneKey)
for i = 1, #fields, 2 do
  local name, untilMs = fields[i], tonumber(fields[i + 1])
  if untilMs <= now then
    if untilMs <= now - margin then rcall('HDEL', doneKey, name) end
  else
    groups = groups + 1
    if name == group then
      first = 0
      retainUntil = math.max(retainUntil, untilMs)
    end
    latest = math.max(latest, untilMs)
  end
end
if first == 1 then groups = groups + 1 end
latest = math.max(latest, retainUntil)

rcall('HSET', doneKey, group, string.format('%d', retainUntil))
rcall('PEXPIRE', doneKey, latest - now + margin)
return {groups, first}
