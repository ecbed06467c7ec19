--[[
  payload-delete-unpublished: the Redis payload store's delete of an orphan
  (`RedisPayloadStore.deleteUnpublished`): the meta goes only while the payload is ready and
  unpublished. `markPublished` sets `published` in one MULTI, so either it finds the meta gone or
  this script finds the payload published.

  KEYS[1] meta    hash    {state, published, chunks, ...}: the payload's meta

  Returns the payload's chunk count once its meta is unlinked; -1 when there is no payload (no
  meta, or one without a state: markPublished's stray); nil when it leaves a payload there.
]]
local meta = redis.call('HMGET', KEYS[1], 'state', 'published', 'chunks')
if not meta[1] then return -1 end
if meta[1] ~= 'ready' or meta[2] == '1' then return false end
redis.call('UNLINK', KEYS[1])
return tonumber(meta[3]) or 0
