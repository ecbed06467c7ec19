--[[
  rsq-release: the holder gives its drain lease up early (the resequencer store's
  `releaseDrain`). No-op for anyone else.

  KEYS[1] state   hash   the key's state (see _resequencer)

  ARGV[1] holder

  Returns 1 when the lease was the holder's and is gone, 0 otherwise.
]]
local stateKey, holder = KEYS[1], ARGV[1]

if redis.call('HGET', stateKey, 'holder') ~= holder then
  return 0
end
redis.call('HDEL', stateKey, 'holder', 'until')
return 1
