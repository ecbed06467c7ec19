--[[
  rsq-renew: extends the drain lease of the holder that still has it (the resequencer store's
  `renewDrain`). Never takes a lease: a free lease, or someone else's, answers 0.

  KEYS[1] state   hash   the key's state (see _resequencer)

  ARGV[1] holder      ARGV[2] now (ms)      ARGV[3] lease ms

  Returns 1 when the lease is the holder's until now + lease ms, 0 otherwise.
]]
--- @include "_clock"
local stateKey, holder = KEYS[1], ARGV[1]
local now, leaseMs = callerTime(ARGV[2]), tonumber(ARGV[3])

if redis.call('HGET', stateKey, 'holder') ~= holder then
  return 0
end
redis.call('HSET', stateKey, 'until', string.format('%d', now + leaseMs))
return 1
