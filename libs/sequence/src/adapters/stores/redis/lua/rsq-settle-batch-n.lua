--[[
  rsq-settle-batch: rsq-settle for several drains in one call, on a single Redis node, each with
  the scope-index step applied inline (as rsq-settle-ix-8): one script call, one reply, instead of
  one per drain. The settles are applied in the order given, each exactly as its own
  rsq-settle-ix-8 call would apply it. A file name ending in "-n" takes any number of keys.

  KEYS[1..5]  the scope's index keys (see rsq-index-5)
  KEYS[6..]   per settle, its key's keys (see _resequencer): state, buffer, handoff

  ARGV[1] lease ms      ARGV[2] limit (most items returned)      ARGV[3] retention ms
  ARGV[4] TTL of the index keys (ms)      ARGV[5] most expired records pruned per step
  ARGV[6..]  per settle, five: member (the key's name), now (ms), holder, count (items
             delivered, >= 1), settle token (see rsq-settle-3)

  Returns one reply per settle, in order, each as rsq-settle-ix-8 returns it.
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"
--- @include "_rsq-settle"

local ik = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}
-- One INCRBY and one HINCRBY of the scope's totals for the whole call (see _rsq-index).
deferTotals = true
local retentionMs, ttl, pruneBatch = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local replies = {}
local function take(i)
  local k, a = 5 + 3 * (i - 1), 5 + 5 * (i - 1)
  stateKey, bufferKey, handOffKey = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local member, now = ARGV[a + 1], ARGV[a + 2]
  local reply = settleStep({now, ARGV[a + 3], ARGV[a + 4], ARGV[1], ARGV[2], ARGV[3],
    ARGV[a + 5]})
  if #reply[2] == 9 then
    reply[2] = applyIndex(ik, member, reply[2], callerTime(now), retentionMs, ttl, pruneBatch)
  end
  replies[i] = reply
end
runBatch((#ARGV - 5) / 5, take, ik, ttl)
return replies
