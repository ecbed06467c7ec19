--[[
  rsq-settle: the lease holder removes the items it delivered from the head of the hand-off
  list and gets the next ones (the resequencer store's `settleDrain`). Only the lease decides:
  a holder whose lease ran out still settles while nobody has taken it over.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] holder      ARGV[3] count (items delivered, >= 1)
  ARGV[4] lease ms      ARGV[5] limit (most items returned)     ARGV[6] retention ms
  ARGV[7] settle token: unique per settleDrain call, so that the call resent after a reconnect
          trims nothing more

  Returns {code, record, ...} (record: see _resequencer):
    'lost', record              the holder no longer holds the lease: nothing trimmed
    'empty', record             the list is empty now: the lease is released
    'claimed', record, items... the lease renewed until now + lease ms, and the next items
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-settle"

return settleStep()
