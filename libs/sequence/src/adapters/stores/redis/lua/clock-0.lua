--[[
  clock: a caller's time on the scripts' clock (see _clock), for the reads that run no script
  (the sweepers' range queries on due times and retention). Read-only.

  ARGV[1] the time, as "<time>:<clock>"

  Returns the time the scripts would use, in whole ms.
]]
--- @include "_clock"

return math.floor(callerTime(ARGV[1]))
