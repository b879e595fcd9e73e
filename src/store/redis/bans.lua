-- sluice: the fleet's bans in Redis. One script, four operations (ARGV[1]); every key
-- carries the hash tag {sluice-bans}, so they share a Redis Cluster slot, and KEYS[1]
-- (the active index) names that slot for clients that route by key.
--
--   sluice:{sluice-bans}:b:HEX   a live ban: "until|refusals|level|reason|caller",
--                                expiring when the ban ends
--   sluice:{sluice-bans}:l:HEX   automatic bans remembered for escalation (a number),
--                                expiring a day after the last one ends
--   sluice:{sluice-bans}:s:HEX   refusals toward a ban: hash w (window start ms),
--                                c (this window), p (the previous one); expires after
--                                two windows
--   sluice:{sluice-bans}:active  zset HEX -> until, for a replica's first full load
--   sluice:{sluice-bans}:changes zset HEX -> ms of the last change, for polling
--
-- strike  after within_ms duration_ms escalate max_ms, then N x (HEX, count, caller):
--         counts refusals; returns the bans this call made, as "HEX|" .. ban
-- ban     HEX duration_ms reason caller: a manual ban; returns it as "HEX|" .. ban
-- lift    HEX: ends the ban and forgets the offences; returns 1 if there was a ban
-- poll    since_ms: returns now, then "HEX|" .. ban or "HEX|" (lifted or ended) for
--         every caller changed after since_ms (every live ban when since_ms is 0)

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local P = 'sluice:{sluice-bans}:'
local REMEMBER_MS = 86400000
-- The two indexes expire when nothing has touched them for longer than any ban
-- lasts (24 h) or than a replica's poll can lag (5 min).
local ACTIVE_TTL_MS = 86400000 + 60000
local CHANGES_TTL_MS = 300000

local function changed(hex)
  redis.call('ZADD', P .. 'changes', now, hex)
  redis.call('PEXPIRE', P .. 'changes', CHANGES_TTL_MS)
end

local function set_ban(hex, ends, refusals, level, reason, caller)
  local value = ends .. '|' .. refusals .. '|' .. level .. '|' .. reason .. '|' .. caller
  redis.call('SET', P .. 'b:' .. hex, value, 'PX', math.max(ends - now, 1))
  redis.call('ZADD', P .. 'active', ends, hex)
  redis.call('PEXPIRE', P .. 'active', ACTIVE_TTL_MS)
  changed(hex)
  return hex .. '|' .. value
end

local op = ARGV[1]
if op == 'strike' then
  local after, within, duration = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local escalate, max_ms = ARGV[5] == '1', tonumber(ARGV[6])
  local made = {}
  for i = 7, #ARGV, 3 do
    local hex, count, caller = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
    if redis.call('EXISTS', P .. 'b:' .. hex) == 0 then
      local key = P .. 's:' .. hex
      local w, c, p = unpack(redis.call('HMGET', key, 'w', 'c', 'p'))
      w, c, p = tonumber(w) or 0, tonumber(c) or 0, tonumber(p) or 0
      local window = now - now % within
      if window ~= w then
        if window == w + within then p = c else p = 0 end
        c, w = 0, window
      end
      c = c + count
      local refusals = c + math.ceil(p * math.max(1 - (now - w) / within, 0))
      if refusals >= after then
        local level = tonumber(redis.call('GET', P .. 'l:' .. hex)) or 0
        local length = duration
        if escalate then length = math.min(duration * 2 ^ math.min(level, 20), max_ms) end
        local ends = now + length
        made[#made + 1] = set_ban(hex, ends, refusals, level, 'automatic', caller)
        redis.call('SET', P .. 'l:' .. hex, level + 1, 'PX', length + REMEMBER_MS)
        redis.call('DEL', key)
      else
        redis.call('HSET', key, 'w', w, 'c', c, 'p', p)
        redis.call('PEXPIRE', key, 2 * within)
      end
    end
  end
  return made
elseif op == 'ban' then
  local hex, duration, reason, caller = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
  return set_ban(hex, now + duration, 0, 0, reason, caller)
elseif op == 'lift' then
  local hex = ARGV[2]
  local existed = redis.call('DEL', P .. 'b:' .. hex)
  redis.call('DEL', P .. 's:' .. hex, P .. 'l:' .. hex)
  redis.call('ZREM', P .. 'active', hex)
  changed(hex)
  return existed
elseif op == 'poll' then
  local since = tonumber(ARGV[2])
  redis.call('ZREMRANGEBYSCORE', P .. 'active', '-inf', now)
  redis.call('ZREMRANGEBYSCORE', P .. 'changes', '-inf', now - 300000)
  local callers
  if since == 0 then
    callers = redis.call('ZRANGEBYSCORE', P .. 'active', now, '+inf')
  else
    callers = redis.call('ZRANGEBYSCORE', P .. 'changes', '(' .. since, '+inf')
  end
  local answer = {tostring(now)}
  for _, hex in ipairs(callers) do
    answer[#answer + 1] = hex .. '|' .. (redis.call('GET', P .. 'b:' .. hex) or '')
  end
  return answer
end
return redis.error_reply('unknown operation ' .. tostring(op))
