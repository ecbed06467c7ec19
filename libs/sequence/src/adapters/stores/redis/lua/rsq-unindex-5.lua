--[[
  rsq-unindex: drops a retired key's record from its scope's index (the step after rsq-retire-3
  on Redis Cluster), unless the index holds a newer one (a change after the retirement): a key
  that holds nothing needs none, and its record would otherwise stay until the store's retention
  prunes it.

  KEYS[1..5] the scope's index keys (see rsq-index-5)

  ARGV[1] key (member)      ARGV[2] ver (as rsq-retire-3 returned it)

  Returns 1.
]]
--- @include "_rsq-gap-score"
--- @include "_rsq-index"

dropIndexedUpTo(KEYS, ARGV[1], tonumber(ARGV[2]))
return 1
