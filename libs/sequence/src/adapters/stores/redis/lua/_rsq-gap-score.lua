-- How the scope index's gaps zset scores a key's open gap: its gapSince while the gap waits for
-- its policy, gapSince + ALERTED_GAP_OFFSET once its alert went out (the key still waits, but no
-- range a sweep reads reaches it). 2^50 ms is the year 37,648, and exact in a double. Included by
-- the index step (_rsq-index) and by rsq-gaps, which must agree on it.
local ALERTED_GAP_OFFSET = 1125899906842624

-- A score as ZADD and ZRANGEBYSCORE take it: redis.call would print a number of 16 digits with
-- %.14g, rounded.
local function scoreText(ms)
  return string.format('%d', ms)
end
