--[[
  rsq-accept-batch: rsq-accept for several events in one call, on a single Redis node, each with
  the scope-index step applied inline (as rsq-accept-ix-8): one script call, one reply, instead of
  one per event. The events are taken in the order given, each exactly as its own rsq-accept-ix-8
  call would take it, except that the scope's buffered totals each is checked against are those
  the events before it in the call left (the first's: those the caller last saw). A file name
  ending in "-n" takes any number of keys (the store passes how many).

  KEYS[1..5]  the scope's index keys (see rsq-index-5)
  KEYS[6..]   per event, its key's keys (see _resequencer): state, buffer, handoff

  ARGV[1] start (next while a key has no state)   ARGV[2] maxBufferedPerKey
  ARGV[3] maxBufferedTotal                         ARGV[4] the scope's buffered total as last seen
  ARGV[5] retention ms                             ARGV[6] lease ms
  ARGV[7] limit (most items a claim returns)       ARGV[8] maxBufferedBytesPerKey (0: none)
  ARGV[9] maxBufferedBytesTotal (0: none)          ARGV[10] the scope's buffered bytes as last seen
  ARGV[11] TTL of the index keys (ms)              ARGV[12] most expired records pruned per step
  ARGV[13] maxSeqAhead (0: none)
  ARGV[14..]  per event, five: member (the key's name), now (ms), seq, the entry (encoded by the
              client), drain holder ('' for none)

  Returns one reply per event, in order, each as rsq-accept-ix-8 returns it.
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"
--- @include "_rsq-accept"

local ik = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}
-- One INCRBY and one HINCRBY of the scope's totals for the whole call (see _rsq-index).
deferTotals = true
local seenTotal, seenBytes = ARGV[4], ARGV[10]
local retentionMs, ttl, pruneBatch = tonumber(ARGV[5]), tonumber(ARGV[11]), tonumber(ARGV[12])
local replies = {}
local function take(i)
  local k, a = 5 + 3 * (i - 1), 13 + 5 * (i - 1)
  stateKey, bufferKey, handOffKey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local member, now = ARGV[a + 1], ARGV[a + 2]
  local reply = acceptStep({now, ARGV[1], ARGV[a + 3], ARGV[a + 4], ARGV[2], ARGV[3], seenTotal,
    ARGV[5], ARGV[a + 5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], seenBytes, ARGV[13]})
  if #reply[2] == 9 then
    reply[2] = applyIndex(ik, member, reply[2], callerTime(now), retentionMs, ttl, pruneBatch)
    seenTotal, seenBytes = tostring(reply[2][1]), tostring(reply[2][2])
  end
  replies[i] = reply
end
runBatch((#ARGV - 13) / 5, take, ik, ttl)
return replies
