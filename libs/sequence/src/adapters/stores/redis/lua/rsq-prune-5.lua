--[[
  rsq-prune: drops the index records of keys past their retention, taking their buffered events
  off the scope total. The index step does the same on about one call in 16; the store runs this
  on its own before `accept` refuses an event for maxBufferedTotal, so that keys nobody came back
  to do not hold room that has been free since they expired. Sets no TTL.

  KEYS[1..5] the scope's index keys (see rsq-index-5)

  ARGV[1] now (ms)      ARGV[2] retention ms      ARGV[3] most records dropped

  Returns the scope's buffered totals after the call: {events, bytes}.
]]
--- @include "_clock"
--- @include "_rsq-gap-score"
--- @include "_rsq-index"

pruneIndex(KEYS, callerTime(ARGV[1]) - tonumber(ARGV[2]), tonumber(ARGV[3]))
return indexTotals(KEYS)
