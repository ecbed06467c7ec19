--[[
  claim-release: the holder gives its lease up (the claim ledger's `release`), so that the
  redelivered message can be claimed at once. No-op for anyone else.

  KEYS[1] lease   hash    {holder, until}: the group's lease on the ticket

  ARGV[1] holder

  Returns 1 when the lease was the holder's and is gone, 0 otherwise.
]]
local leaseKey, holder = KEYS[1], ARGV[1]

if redis.call('HGET', leaseKey, 'holder') ~= holder then return 0 end
redis.call('DEL', leaseKey)
return 1
