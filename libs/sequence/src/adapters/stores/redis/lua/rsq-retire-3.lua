--[[
  rsq-retire: lets a key that holds nothing expire soon (the resequencer store's `retire`): its
  state (its `next`, which makes repeats `late`) is kept until now + retainMs, or its ordinary
  expiry if sooner; a change before then (saveState) ends the retirement, and so does any change
  of the key's ver (retireVer records the one retired: an instance that predates retirement keeps
  the fields when it changes the key). A key with buffered events or hand-off items, or with no
  state, is left as it is.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] retainMs      ARGV[3] retention ms

  Returns {retired (1 | 0), ver}: ver is the key's, for the index step that drops the key's
  record (rsq-unindex-5) unless a newer one was applied.
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-retire"

return retireStep()
