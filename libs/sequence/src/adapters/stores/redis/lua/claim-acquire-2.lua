--[[
  claim-acquire: one consumer group's claim of one ticket (the claim ledger's `claim`).

  KEYS[1] done    hash    group -> retainUntil (ms): the ticket's completed groups
  KEYS[2] lease   hash    {holder, until}: this group's lease on the ticket

  ARGV[1] group            ARGV[2] holder           ARGV[3] now (ms)
  ARGV[4] lease ms         ARGV[5] key TTL margin ms

  Returns 'done' (the group completed the ticket and it is still retained), 'busy' (another
  holder's lease is live: until > now), or 'claimed' (the lease is the caller's until
  now + lease ms: taken, taken over after a lapse, or renewed).
]]
--- @include "_clock"
local rcall = redis.call
local doneKey, leaseKey = KEYS[1], KEYS[2]
local group, holder = ARGV[1], ARGV[2]
local now, leaseMs, margin = callerTime(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local retainUntil = tonumber(rcall('HGET', doneKey, group))
if retainUntil then
  -- Also on the caller's own clock: a caller whose clock runs behind checked the ticket's expiry
  -- on it, and still takes the ticket for valid; its duplicate must meet the completion.
  local callerNow = tonumber(string.match(ARGV[3], '^[^:]+'))
  if retainUntil > math.min(now, callerNow) then return 'done' end
  -- Past its retention on both clocks: not this caller's answer. Removed only once past it by
  -- more than the margin, as claim-complete removes it: until then a caller whose clock runs
  -- behind (by up to the margin) still meets it.
  if retainUntil <= now - margin then rcall('HDEL', doneKey, group) end
end

local lease = rcall('HMGET', leaseKey, 'holder', 'until')
local leaseUntil = tonumber(lease[2])
if lease[1] and leaseUntil and leaseUntil > now and lease[1] ~= holder then return 'busy' end

rcall('HSET', leaseKey, 'holder', holder, 'until', string.format('%d', now + leaseMs))
rcall('PEXPIRE', leaseKey, leaseMs + margin)
return 'claimed'
