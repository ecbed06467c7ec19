--[[
  rsq-claim: takes the drain lease of a key and the head of its hand-off list (the resequencer
  store's `claimDrain`). The lease changes, and the key's last activity (see saveClaim): when
  its TTLs are due for renewal, the claim returns the key's index record, else {}.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] holder      ARGV[3] lease ms
  ARGV[4] limit (most items returned)       ARGV[5] retention ms

  Returns {code, {}, ...}:
    'empty', record  nothing waits (the holder's own lease, if any, is released); the key's
                     index record (see _resequencer), to repair a stale index entry ({ver}
                     for a retired key: see repairRecord)
    'busy', {}       another holder's lease is live (until > now)
    'claimed', record, items...   the lease is the holder's until now + lease ms
]]
--- @include "_clock"
--- @include "_resequencer"

local now, holder = callerTime(ARGV[1]), ARGV[2]
local leaseMs, limit, retentionMs = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local s = loadState(now, retentionMs)
if rcall('LLEN', handOffKey) == 0 then
  if s.holder == holder then
    rcall('HDEL', stateKey, 'holder', 'until')
  end
  -- A hand-off list gone while the state still tracks it (lost to eviction, a partial restore):
  -- nothing waits, so its stall entry must go, or every sweep lists the key again.
  if s.next and (s.track or s.handOffAt) then
    s.track, s.handOffAt = false, nil
    rcall('HSET', stateKey, 'track', '0')
    rcall('HDEL', stateKey, 'handOffAt')
  end
  -- The key's record, forced: the sweeper's and waiters' claims that find nothing repair an
  -- index entry (a stalled hand-off, a gap) whose update a crash lost (rare: not a hot path).
  -- A retired key's is {ver}: its entries are dropped (see repairRecord).
  return {'empty', repairRecord(s, now)}
end
if s.holder and s.holder ~= holder and s.leaseUntil and s.leaseUntil > now then
  return {'busy', {}}
end

s.holder, s.leaseUntil = holder, now + leaseMs
local record = saveClaim(s, now, retentionMs) or {}
local reply = rcall('LRANGE', handOffKey, 0, limit - 1)
table.insert(reply, 1, record)
table.insert(reply, 1, 'claimed')
return reply
