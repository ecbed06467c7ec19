--[[
  rsq-accept: one event offered to its resequencer key (the resequencer store's `accept`).
  Checks, in order: late (below next), next in line (released with the contiguous run after it),
  duplicate (already buffered), how far ahead of next, the limits, and else buffers it.

  KEYS: see _resequencer (state, buffer, handoff)

  ARGV[1] now (ms)               ARGV[2] start (next while the key has no state)
  ARGV[3] seq                    ARGV[4] the entry, encoded by the client
  ARGV[5] maxBufferedPerKey      ARGV[6] maxBufferedTotal
  ARGV[7] the scope's buffered total as the caller last saw it (checked against ARGV[6])
  ARGV[8] retention ms
  ARGV[9] drain holder ('' for none)  ARGV[10] lease ms   ARGV[11] limit (most items returned)
  ARGV[12] maxBufferedBytesPerKey (0: none)    ARGV[13] maxBufferedBytesTotal (0: none)
  ARGV[14] the scope's buffered bytes as the caller last saw them (checked against ARGV[13])
  ARGV[15] maxSeqAhead (0: none): an event to be buffered more than this past next is refused

  The per-key bounds count the buffer and the hand-off list; the event that fills the gap is
  refused for them only while the hand-off list is not empty.

  Returns {code, record, ...} (record: see _resequencer; sent on every outcome, so that a
  redelivered event repairs an index step lost to a crash):
    'late', record, next, pending (1 while the hand-off list is not empty)[, drain]
    'released', record, next, count[, drain]
  where drain, with a holder (and for 'late' only when pending), is 'busy', or 'claimed'
  followed by the head items of the hand-off list (the lease is then the holder's, as rsq-claim)
    'duplicate', record, next
    'full', record, next, 'maxBufferedPerKey' | 'maxBufferedTotal' | 'maxBufferedBytesPerKey'
      | 'maxBufferedBytesTotal' | 'maxSeqAhead'
    'buffered', record, next, buffered
]]
--- @include "_clock"
--- @include "_resequencer"
--- @include "_rsq-accept"

return acceptStep()
