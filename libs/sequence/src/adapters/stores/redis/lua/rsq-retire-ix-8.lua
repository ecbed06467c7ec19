--[[
  rsq-retire-ix: rsq-retire on a single Redis node, with the key's index record dropped inline
  (as rsq-unindex-5 does on Redis Cluster, where the index lives in another slot).

  KEYS[1..3]  the key's keys (see _resequencer)
  KEYS[4..8]  the scope's index keys (see rsq-index-5)
  ARGV        rsq-retire-3's, then: member (the key's name)

  Returns rsq-retire-3's reply.
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"
--- @include "_rsq-retire"

local reply = retireStep()
if reply[1] == 1 then
  dropIndexedUpTo({KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]}, ARGV[4], reply[2])
end
return reply
