-- The body of rsq-retire (see rsq-retire-3.lua for KEYS, ARGV and returns), as a function, so that
-- the single-node variant rsq-retire-ix-8 can drop the key's index record inline after it.
local function retireStep()
  local now, retainMs, retentionMs = callerTime(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local s = loadState(now, retentionMs)
  if not s.next or rcall('ZCARD', bufferKey) > 0 or rcall('LLEN', handOffKey) > 0 then
    return {0, s.ver}
  end
  local retireAt = math.min(now + retainMs, s.at + retentionMs)
  if s.retireAt and s.retireAt <= retireAt then
    return {1, s.ver}
  end
  -- Not a change (no saveState): `at` and `ver` stay. The retirement holds while `ver` does (see
  -- loadState). ttlAt goes: the next change, whatever instance makes it, renews the TTLs.
  rcall('HSET', stateKey, 'retireAt', int(retireAt), 'retireVer', int(s.ver))
  rcall('HDEL', stateKey, 'ttlAt')
  -- In real time, gone a little after retireAt (as saveState's TTLs: a tenth more, and at least
  -- the callers' clock tolerance), never later than the TTL the key has.
  local ttl = retireAt - now + math.max(math.floor(retainMs / 10), 1000)
  local current = rcall('PTTL', stateKey)
  if current < 0 or ttl < current then
    rcall('PEXPIRE', stateKey, ttl)
  end
  return {1, s.ver}
end
