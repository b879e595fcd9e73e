-- sluice: decide a batch of requests, each against its caller's windows and its
-- policy's total, all or nothing, with Redis's own clock. The same algorithm as
-- src/limit/runs.rs. The requests are decided one after the other, in order, inside
-- one atomic script run.
--
-- KEYS     per request: the caller's counters, then the policy's total counters when
--          the request has total quotas. Each is a hash; per window slot s:
--            "s:cur", "s:count", "s:unit"  the newest run: its bucket, count and
--                                       bucket_ms (1 = exact ms; slot 4 = calendar
--                                       day, bucket = day)
--            "s:bucket_ms:bucket" -> count  the older runs
--            "s:sum"  -> requests counted in the slot's live runs
--            "s:next" -> ms at which the slot's oldest run expires
--          so a request reads the five fields of each window with one HMGET and
--          counts with one HSET while its run is the newest; the older runs are only
--          listed when something has expired or a refusal needs its exact wait.
-- ARGV[1]  N, the number of requests; then per request:
--            cost (0 = only report, count nothing)
--            P, the number of plan quotas; T, the number of total quotas
--            P + T quotas of 4 values: slot (0-3 sliding, 4 calendar day), limit,
--              bucket_ms (1 = exact milliseconds), window length_ms
--            C, the number of calendar days given, and C x (index, start_ms, end_ms)
--
-- Returns {now_ms, then per request: admitted (0/1), Q, and Q x (used, reset_ms,
-- retry_ms (-1 when that quota admits))} where Q counts the quotas checked: total
-- quotas are checked only if the caller's own quotas admitted.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local LENGTHS = {[0] = 1000, [1] = 60000, [2] = 3600000, [3] = 86400000, [4] = 0}
local META = {[0] = '0:meta', '1:meta', '2:meta', '3:meta', '4:meta'}

-- The calendar day holding `now` for the request being decided.
local day_index, day_end = -1, now

-- Ms until a run stops counting; 0 if it already has.
local function expires_in(slot, bucket_ms, bucket)
  if slot == 4 then
    if bucket >= day_index then return math.max(day_end - now, 1) end
    return 0
  end
  local ends = (bucket + 1) * bucket_ms + LENGTHS[slot] - 1 - now
  if ends < 0 then return 0 end
  return ends
end

local function current(slot, bucket_ms)
  if slot == 4 then return day_index end
  return math.floor(now / bucket_ms)
end

-- Each key's per-slot state {sum, next_at, cur, count, unit, dirty}, read once per
-- script run and written back once at its end, so a caller (or a total) that has
-- several requests in one batch costs one HMGET and one HSET for all of them.
local cache, touched, ttl_needed = {}, {}, {}

local function state(key, slot)
  local slots = cache[key]
  if slots == nil then
    slots = {}
    cache[key] = slots
    touched[#touched + 1] = key
  end
  local st = slots[slot]
  if st == nil then
    local raw = redis.call('HGET', key, META[slot])
    if raw then
      local sum, next_at, cur, count, unit = struct.unpack('<ddddd', raw)
      st = {sum, next_at, cur, count, unit, false}
    else
      st = {0, 0, -1, 0, 1, false}
    end
    slots[slot] = st
  end
  return st
end

-- The live runs of a slot as {ms left, count}, soonest first; expired older runs are
-- deleted, an expired newest run emptied, and the slot's sum and next expiry
-- recomputed in `st`.
local function prune(key, slot, st)
  local flat = redis.call('HGETALL', key)
  local runs, sum, next_at = {}, 0, 0
  local function live(left, count)
    runs[#runs + 1] = {left, count}
    sum = sum + count
    if next_at == 0 or now + left < next_at then next_at = now + left end
  end
  for i = 1, #flat, 2 do
    local s, bucket_ms, bucket = string.match(flat[i], '^(%d+):(%d+):(%d+)$')
    if s and tonumber(s) == slot then
      local left = expires_in(slot, tonumber(bucket_ms), tonumber(bucket))
      if left > 0 then live(left, tonumber(flat[i + 1])) else redis.call('HDEL', key, flat[i]) end
    end
  end
  if st[4] > 0 then
    local left = expires_in(slot, st[5], st[3])
    if left > 0 then live(left, st[4]) else st[4] = 0 end
  end
  table.sort(runs, function(a, b) return a[1] < b[1] end)
  st[1], st[2], st[6] = sum, next_at, true
  return runs
end

-- Checks quotas [first, first + count) of the request whose quotas start at ARGV[q0]
-- against `key`, appending (used, reset, retry) per quota to `out`.
local function check(key, cost, q0, first, count, out)
  local admit = true
  for q = first, first + count - 1 do
    local at = q0 + 4 * q
    local slot, limit, bucket_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local st = state(key, slot)
    local runs = nil
    if st[1] > 0 and now >= st[2] then runs = prune(key, slot, st) end
    local used = st[1]
    local reset
    if used > 0 then reset = st[2] - now
    else reset = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1) end
    local retry = -1
    if used + cost > limit then
      admit = false
      if runs == nil then runs = prune(key, slot, st) end
      local left = used
      for _, run in ipairs(runs) do
        left = left - run[2]
        if left + cost <= limit then retry = math.max(run[1], 1) break end
      end
      if retry < 0 then
        retry = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1)
      end
    end
    out[#out + 1] = used
    out[#out + 1] = reset
    out[#out + 1] = retry
  end
  return admit
end

-- Counts `cost` in quotas [first, first + count) on `key`. While the current bucket
-- is the newest run only the cached state changes; when a new bucket starts, the
-- newest run moves to its own field and the key's TTL must cover the new run (an
-- older run's expiry was covered when it was new).
local function commit(key, cost, q0, first, count)
  for q = first, first + count - 1 do
    local at = q0 + 4 * q
    local slot, bucket_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 2])
    local st = cache[key][slot]
    local bucket = current(slot, bucket_ms)
    local left = expires_in(slot, bucket_ms, bucket)
    if st[1] == 0 then st[2] = now + left end
    st[1] = st[1] + cost
    if st[3] == bucket and st[5] == bucket_ms then
      st[4] = st[4] + cost
    else
      if st[4] > 0 then
        redis.call('HINCRBY', key, slot .. ':' .. st[5] .. ':' .. st[3], st[4])
      end
      st[3], st[4], st[5] = bucket, cost, bucket_ms
      if left > (ttl_needed[key] or 0) then ttl_needed[key] = left end
    end
    st[6] = true
  end
end

local answer = {now}
local at, key_at = 2, 1
for _ = 1, tonumber(ARGV[1]) do
  local cost = tonumber(ARGV[at])
  local plan_count, total_count = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local q0 = at + 3
  local days_at = q0 + 4 * (plan_count + total_count)
  local days = tonumber(ARGV[days_at])
  day_index, day_end = -1, now
  for i = 0, days - 1 do
    local d = days_at + 1 + 3 * i
    local start_ms, end_ms = tonumber(ARGV[d + 1]), tonumber(ARGV[d + 2])
    if now >= start_ms and now < end_ms then
      day_index, day_end = tonumber(ARGV[d]), end_ms
    end
  end
  at = days_at + 1 + 3 * days

  local caller_key, total_key = KEYS[key_at], KEYS[key_at + 1]
  if total_count > 0 then key_at = key_at + 2 else key_at = key_at + 1 end

  local out = {}
  local admit = check(caller_key, cost, q0, 0, plan_count, out)
  if admit and total_count > 0 then
    admit = check(total_key, cost, q0, plan_count, total_count, out)
    if admit and cost > 0 then commit(total_key, cost, q0, plan_count, total_count) end
  end
  if admit and cost > 0 then commit(caller_key, cost, q0, 0, plan_count) end
  if admit then answer[#answer + 1] = 1 else answer[#answer + 1] = 0 end
  answer[#answer + 1] = #out / 3
  for _, value in ipairs(out) do answer[#answer + 1] = value end
end

-- Write back what changed: one HSET per key, and its TTL when a run was created.
for _, key in ipairs(touched) do
  local fields = {}
  for slot, st in pairs(cache[key]) do
    if st[6] then
      fields[#fields + 1] = META[slot]
      fields[#fields + 1] = struct.pack('<ddddd', st[1], st[2], st[3], st[4], st[5])
    end
  end
  if #fields > 0 then redis.call('HSET', key, unpack(fields)) end
  local ttl = ttl_needed[key]
  if ttl ~= nil and redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl + 1000)
  end
end
return answer
