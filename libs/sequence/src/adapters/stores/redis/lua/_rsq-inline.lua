-- Applies a per-key script's index record (reply field 2) to the scope index inline, on a single
-- Redis node (see the rsq-*-ix-8 scripts): KEYS[4..8] are the index keys, and the last five
-- ARGV the member, now, retention ms, index TTL ms and the prune batch.
local function withIndex(reply)
  local record = reply[2]
  local n = #ARGV
  local ik = {KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]}
  if #record == 9 then
    reply[2] = applyIndex(ik, ARGV[n - 4], record, callerTime(ARGV[n - 3]), tonumber(ARGV[n - 2]),
      tonumber(ARGV[n - 1]), tonumber(ARGV[n]))
  elseif #record == 1 then
    -- A retired key's {ver} (see repairRecord): its entries are dropped.
    dropIndexedUpTo(ik, ARGV[n - 4], record[1])
    reply[2] = indexTotals(ik)
  end
  return reply
end
