-- How the scope index's gaps zset scores a key's open gap: its gapSince while the gap waits for
-- its policy, gapSince + ALERTED_GAP_OFFSET once its alert went out (the key still waits, but no
-- range a sweep reads reaches it). 2^50 ms is the year 37,648, and exact in a double. Included by
-- the index step (_rsq-index) and by rsq-gaps and rsq-expiring, which must agree on it.
local ALERTED_GAP_OFFSET = 1125899906842624

-- A score as ZADD and ZRANGEBYSCORE take it: redis.call would print a number of 16 digits with
-- %.14g, rounded.
local function scoreText(ms)
  return string.format('%d', ms)
end

-- Listings' order of keys with equal times: byte order, as Redis orders members of equal score
-- (Lua's < on strings follows the locale).
local function beforeKey(a, b)
  for k = 1, math.min(#a, #b) do
    local x, y = string.byte(a, k), string.byte(b, k)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end
