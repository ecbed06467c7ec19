--[[
  rsq-accept-ix: rsq-accept on a single Redis node, with the scope-index step applied inline (one
  round trip instead of two; on Redis Cluster the index lives in another slot, and the store runs
  rsq-accept-3 then rsq-index-5).

  KEYS[1..3]  the key's keys (see _resequencer)
  KEYS[4..8]  the scope's index keys (see rsq-index-5)
  ARGV        rsq-accept-3's, then: member (the key's name), now (ms), retention ms, index TTL ms,
              most expired records pruned

  Returns rsq-accept-3's reply, with the record (field 2) replaced, once applied, by the
  scope's buffered totals after the step: {events, bytes}.
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"
--- @include "_rsq-inline"
--- @include "_rsq-accept"

return withIndex(acceptStep())
