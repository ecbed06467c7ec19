-- The body of rsq-settle (see rsq-settle-3.lua for KEYS, ARGV and returns), as a function, so that
-- the single-node variants rsq-settle-ix-8 and rsq-settle-batch-n can apply the scope index inline
-- after it. A: the arguments, laid out as rsq-settle-3's ARGV (default ARGV), as strings.
local function settleStep(A)
  local ARGV = A or ARGV
  local now, holder, count = callerTime(ARGV[1]), ARGV[2], tonumber(ARGV[3])
  local leaseMs, limit, retentionMs = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local token = ARGV[7]

  local s = loadState(now, retentionMs)
  -- The client resending this very call after a reconnect (its reply was lost): it was applied,
  -- so it must not trim again, which would drop items nobody delivered.
  local replayed = s.next ~= nil and s.lastSettle == token
  if replayed and s.holder ~= holder then
    -- The first run emptied the list and let the lease go, or another holder has taken it since.
    return {rcall('LLEN', handOffKey) == 0 and 'empty' or 'lost', {}}
  end
  if not s.next or s.holder ~= holder then
    return {'lost', {}}
  end
  -- Only a tracked hand-off (see indexRecordIf) is in the index: only its progress is news.
  local wasTracked = s.track

  local left
  if replayed then
    left = rcall('LLEN', handOffKey)
  else
    left = trimHandOff(s, count)
    s.settled = token -- written with the state, below
  end
  if left == 0 then
    s.holder, s.leaseUntil, s.handOffAt, s.track = nil, nil, nil, false
    saveState(s, now, retentionMs)
    return {'empty', wasTracked and indexRecord(s) or {}}
  end
  -- Progress: the stall clock restarts.
  s.handOffAt, s.leaseUntil = now, now + leaseMs
  saveState(s, now, retentionMs)
  local reply = rcall('LRANGE', handOffKey, 0, limit - 1)
  table.insert(reply, 1, wasTracked and indexRecord(s) or {})
  table.insert(reply, 1, 'claimed')
  return reply
end
