--[[
  rsq-index: the scope-index step that follows every per-key script (a script runs in one slot,
  and a scope's index lives in a slot of its own). Applies a key's index record unless a newer
  one (higher ver) was applied already: idempotent, and safe whatever order two instances'
  records arrive in. First prunes records of keys past their retention, so that their buffered
  events leave the total and their gaps and hand-offs are no longer listed.

  KEYS[1] records   hash   key -> "ver:buffered:next:lowest:bytes"; '' -> the scope's buffered
                           bytes (the sum of the records' bytes)
  KEYS[2] gaps      zset   key -> gapSince for open gaps not alerted, gapSince + 2^50 once alerted
  KEYS[3] stalled   zset   key -> handOffAt, for hand-off lists not empty
  KEYS[4] activity  zset   key -> at (time of its last indexed change)
  KEYS[5] total     string events buffered in the scope (sum of the records' buffered)

  ARGV[1] key        ARGV[2] ver         ARGV[3] buffered     ARGV[4] next
  ARGV[5] lowest | -1                    ARGV[6] gapSince | -1          ARGV[7] alerted (1 | 0)
  ARGV[8] handOffAt | -1                 ARGV[9] at           ARGV[10] now (ms)
  ARGV[11] retention ms                  ARGV[12] TTL of the index keys (ms)
  ARGV[13] most expired records pruned by this call
  ARGV[14] bytes buffered by the key

  Returns the scope's buffered totals after the call: {events, bytes}.
]]
--- @include "_clock"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"

local record = {}
for i = 2, 9 do
  record[i - 1] = tonumber(ARGV[i])
end
record[9] = tonumber(ARGV[14]) or 0
return applyIndex(KEYS, ARGV[1], record, callerTime(ARGV[10]), tonumber(ARGV[11]),
  tonumber(ARGV[12]), tonumber(ARGV[13]))
