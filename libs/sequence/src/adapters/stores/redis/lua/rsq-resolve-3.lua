--[[
  rsq-resolve: applies a gap policy to a key (the resequencer store's `resolveGap`), only if the
  key still has a gap opened at or before openedBefore (and, for 'alert', not alerted yet): of
  several sweepers that listed the same gap, one resolves it.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)      ARGV[2] policy: 'alert' | 'skip' | 'dead-letter'
  ARGV[3] openedBefore (ms)                 ARGV[4] retention ms
  ARGV[5] unchangedSince: '' for none, else the key's last change (its state's `at`, as
          rsq-expiring reported it) must be at or before it
  ARGV[6] '1': with 'dead-letter', close the key (next = CLOSED_KEY_NEXT, past every sequence)

  Returns {code, record, ...} (record: see _resequencer):
    'none', record   ({ver} for a retired key: see repairRecord)
    'resolved', record, appended (hand-off items appended)
      and with 'skip': from, to (the sequences given up), gapSince (when that gap opened)
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-resolve"

return resolveStep()
