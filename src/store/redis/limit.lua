-- sluice: decide a batch of requests, each against its caller's windows and its
-- policy's total, all or nothing, with Redis's own clock. The same algorithm as
-- src/limit/runs.rs. The requests are decided one after the other, in order, inside
-- one atomic script run.
--
-- KEYS     the distinct keys the batch's requests count in (callers' counters and
--          policies' totals; on a Cluster, ARGV[2..] instead, see below). Each is a
--          hash:
--            "m"  the key's state, packed: its expiry (ms, as last set by this
--                 script), the number of slots present, then per slot: slot,
--                 requests counted in its live runs, ms at which its oldest run
--                 expires, and its newest run (bucket, count, bucket_ms; 1 = exact
--                 ms; slot 4 = calendar day, bucket = day; slots 5 and 6 =
--                 billing month and year, bucket = the minute the period ends)
--            "s:bucket_ms:bucket" -> count  the slot's older runs
--          so a key costs one HGET and one HSET per batch while its runs are the
--          newest; older runs are only listed when something has expired or a refusal
--          needs its exact wait.
-- ARGV[1]  the batch, packed little-endian (see src/store/batch.rs):
--            N u16, S u16, deadline f64 (Redis ms: a decision run after it counts
--              nothing and answers "late"; 0 = none; refunds and charges count
--              whenever they run, see src/store/redis/deadline.rs)
--            S shapes (a policy's quotas at one moment):
--              P u8, T u8 (plan and total quota counts), C u8 (calendar days),
--              B u8 (billing periods)
--              P + T quotas: slot u8 (0-3 sliding, 4 calendar day, 5 month, 6 year),
--                limit u32, bucket_ms u32 (1 = exact milliseconds)
--              C days: index u32, start_ms f64, end_ms f64
--              B periods: slot u8, start_ms f64, end_ms f64, next_end_ms f64 (the
--                period holding the gateway's clock and the one after it; the one
--                holding Redis's clock counts, in the bucket of the minute it ends)
--            N requests: cost u32 (0 = only report; top bit set = a refund, followed
--              by the ms it was admitted at as f64; bit 30 set = a charge, counted
--              whether or not it fits: a cost known after the response, which may
--              take the caller into debt; bit 29 set = a stacked decision, see
--              below), caller key u16, total key u16 (0 = none), shape u16 (indexes
--              are 1-based)
--            a stacked decision (a route of several policies) continues with:
--              shadow u8 (the first policy's mode: 1 = shadow), M u8, then M x
--              (key u16, shape u16, shadow u8): the other policies, none with a
--              total. Every policy is checked; the cost is counted in each that has
--              room if every policy not in shadow mode has, in none otherwise.
--
-- Returns one string: Redis's now (ms, f64), then per request: admitted u8, Q u8, and
-- Q x (used, reset_ms, retry_ms (-1 when that quota admits)) as f64, where Q counts the
-- quotas checked: total quotas are checked only if the caller's own quotas admitted.
-- A stacked decision answers one such record per policy, admitted meaning that
-- policy had room. A decision (stacked or not) run after the deadline answers one
-- record admitted = 2, Q = 0, and counts nothing.
-- A refund takes back what a request admitted at that instant counted (only from the
-- runs of that instant's buckets, so never more) and answers admitted = 1, Q = 0; a
-- refund at -1 (a negative hit) takes from the newest runs instead, never below 0.

local unpack_at, pack = struct.unpack, struct.pack

-- On a Redis Cluster one call may carry requests of several slots of one node: only
-- the first key is declared then (it routes the call), every key follows the batch
-- in ARGV, and each is touched before anything is written, so a key this node does
-- not serve fails the whole call unwritten (src/store/redis/batch.rs).
local keys = KEYS
if #ARGV > 1 then
  keys = {unpack(ARGV, 2)}
  for _, key in ipairs(keys) do redis.call('EXISTS', key) end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local LENGTHS = {[0] = 1000, [1] = 60000, [2] = 3600000, [3] = 86400000, [4] = 0}

-- The calendar day holding `now` for the request being decided.
local day_index, day_end = -1, now
-- The bucket of the billing period holding `now`, per slot (5, 6), for the request
-- being decided.
local period_bucket = {}

-- Ms until a run stops counting; 0 if it already has.
local function expires_in(slot, bucket_ms, bucket)
  if slot == 4 then
    if bucket >= day_index then return math.max(day_end - now, 1) end
    return 0
  end
  if slot >= 5 then return math.max(bucket * 60000 - now, 0) end
  local ends = (bucket + 1) * bucket_ms + LENGTHS[slot] - 1 - now
  if ends < 0 then return 0 end
  return ends
end

local function current(slot, bucket_ms)
  if slot == 4 then return day_index end
  if slot >= 5 then return period_bucket[slot] or 0 end
  return math.floor(now / bucket_ms)
end

-- Each key's state {expiry, ttl needed, dirty, slots = {[slot] = {sum, next_at, cur,
-- count, unit}}}, read once per script run and written back once at its end, so a
-- caller (or a total) with several requests in one batch costs one HGET and one HSET.
local cache, touched = {}, {}

local function load(key)
  local k = cache[key]
  if k ~= nil then return k end
  k = {0, 0, false, {}}
  local raw = redis.call('HGET', key, 'm')
  if raw then
    local expiry, count, pos = unpack_at('<dB', raw)
    k[1] = expiry
    for _ = 1, count do
      local slot, sum, next_at, cur, runs, unit
      slot, sum, next_at, cur, runs, unit, pos = unpack_at('<Bddddd', raw, pos)
      k[4][slot] = {sum, next_at, cur, runs, unit}
    end
  end
  cache[key] = k
  touched[#touched + 1] = key
  return k
end

local function state(key, slot)
  local slots = load(key)[4]
  local st = slots[slot]
  if st == nil then
    st = {0, 0, -1, 0, 1}
    slots[slot] = st
  end
  return st
end

-- Deletes a slot's expired older runs, empties an expired newest run and recomputes
-- the slot's sum and next expiry in `st`; with `listed`, returns the live runs as
-- {ms left, count}, soonest first (only a refusal needs them).
local function prune(key, slot, st, listed)
  local flat = redis.call('HGETALL', key)
  local runs, sum, next_at = {}, 0, 0
  local function live(left, count)
    if listed then runs[#runs + 1] = {left, count} end
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
  if listed then table.sort(runs, function(a, b) return a[1] < b[1] end) end
  st[1], st[2] = sum, next_at
  cache[key][3] = true
  return runs
end

-- The values of the request being decided: admitted, Q, then per quota (used, reset,
-- retry), reused from request to request.
local values, filled = {}, 2

-- Checks quotas [first, last] of `quotas` against `key`, appending (used, reset,
-- retry) per quota to `values`.
local function check(key, cost, quotas, first, last)
  local admit = true
  for q = first, last do
    local quota = quotas[q]
    local slot, limit, bucket_ms = quota[1], quota[2], quota[3]
    local st = state(key, slot)
    if st[1] > 0 and now >= st[2] then prune(key, slot, st, false) end
    local used = st[1]
    local reset
    if used > 0 then reset = st[2] - now
    else reset = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1) end
    local retry = -1
    if used + cost > limit then
      admit = false
      local left = used
      for _, run in ipairs(prune(key, slot, st, true)) do
        left = left - run[2]
        if left + cost <= limit then retry = math.max(run[1], 1) break end
      end
      if retry < 0 then
        retry = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1)
      end
    end
    values[filled + 1], values[filled + 2], values[filled + 3] = used, reset, retry
    filled = filled + 3
  end
  return admit
end

-- Counts `cost` in quotas [first, last] of `quotas` on `key`. While the current
-- bucket is the newest run only the cached state changes; when a new bucket starts,
-- the newest run moves to its own field and the key's TTL must cover the new run (an
-- older run's expiry was covered when it was new).
local function commit(key, cost, quotas, first, last)
  local k = cache[key]
  for q = first, last do
    local quota = quotas[q]
    local slot, bucket_ms = quota[1], quota[3]
    local st = k[4][slot]
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
      if left > k[2] then k[2] = left end
    end
  end
  k[3] = true
end

-- The calendar day holding `at` among a shape's days (-1 when none does).
local function day_of(days, at)
  for _, day in ipairs(days) do
    if at >= day[2] and at < day[3] then return day[1] end
  end
  return -1
end

-- The bucket of the billing period holding `at` among a shape's periods of `slot`:
-- the minute the period ends.
local function period_of(periods, slot, at)
  local p = periods[slot]
  if p == nil then return -1 end
  local ends = p[2]
  if at < p[1] then ends = p[1] elseif at >= p[2] then ends = p[3] end
  return math.ceil(ends / 60000)
end

-- Takes back `cost` counted at `at` in quotas [first, last] of `quotas` on `key`:
-- from the newest run when it is `at`'s bucket, else from that bucket's older run.
local function uncount(key, cost, at, days, periods, quotas, first, last)
  local k = load(key)
  for q = first, last do
    local quota = quotas[q]
    local slot, bucket_ms = quota[1], quota[3]
    local st = k[4][slot]
    if st ~= nil and st[1] > 0 then
      local bucket
      if slot == 4 then bucket = day_of(days, at)
      elseif slot >= 5 then bucket = period_of(periods, slot, at)
      else bucket = math.floor(at / bucket_ms) end
      local taken = 0
      if st[3] == bucket and st[5] == bucket_ms and st[4] > 0 then
        taken = math.min(cost, st[4])
        st[4] = st[4] - taken
      else
        local field = slot .. ':' .. bucket_ms .. ':' .. bucket
        local count = tonumber(redis.call('HGET', key, field) or '0')
        taken = math.min(cost, count)
        if taken > 0 and taken == count then redis.call('HDEL', key, field)
        elseif taken > 0 then redis.call('HINCRBY', key, field, -taken) end
      end
      st[1] = math.max(st[1] - taken, 0)
      k[3] = true
    end
  end
end

-- Takes up to `cost` off quotas [first, last] of `quotas` on `key`, newest runs
-- first, whenever they were counted (a negative hit; never below zero).
local function give_back(key, cost, quotas, first, last)
  load(key)
  for q = first, last do
    local slot = quotas[q][1]
    local st = state(key, slot)
    prune(key, slot, st, false)
    local taken = math.min(cost, st[4])
    st[4] = st[4] - taken
    if taken < cost then
      local flat, older = redis.call('HGETALL', key), {}
      for i = 1, #flat, 2 do
        local s, bucket_ms, bucket = string.match(flat[i], '^(%d+):(%d+):(%d+)$')
        if s and tonumber(s) == slot then
          local starts = tonumber(bucket) * math.max(tonumber(bucket_ms), 1)
          older[#older + 1] = {starts, flat[i], tonumber(flat[i + 1])}
        end
      end
      table.sort(older, function(a, b) return a[1] > b[1] end)
      for _, run in ipairs(older) do
        if taken >= cost then break end
        local n = math.min(cost - taken, run[3])
        if n == run[3] then redis.call('HDEL', key, run[2])
        else redis.call('HINCRBY', key, run[2], -n) end
        taken = taken + n
      end
    end
    prune(key, slot, st, false)
  end
end

local batch = ARGV[1]
local n, shape_count, deadline, pos = unpack_at('<HHd', batch)
local LATE = pack('<BB', 2, 0)
local late = deadline > 0 and now > deadline

-- Shapes: {quotas = {{slot, limit, bucket_ms}...}, plan count, total count, day index,
-- day end}, the day being whichever of the given days holds `now`.
local shapes = {}
for s = 1, shape_count do
  local plan_count, total_count, days, period_count
  plan_count, total_count, days, period_count, pos = unpack_at('<BBBB', batch, pos)
  local quotas = {}
  for q = 1, plan_count + total_count do
    local slot, limit, bucket_ms
    slot, limit, bucket_ms, pos = unpack_at('<BI4I4', batch, pos)
    quotas[q] = {slot, limit, bucket_ms}
  end
  local index, ends, listed = -1, now, {}
  for d = 1, days do
    local day, start_ms, end_ms
    day, start_ms, end_ms, pos = unpack_at('<I4dd', batch, pos)
    listed[d] = {day, start_ms, end_ms}
    if now >= start_ms and now < end_ms then index, ends = day, end_ms end
  end
  local periods, buckets = {}, {}
  for _ = 1, period_count do
    local slot, start_ms, end_ms, next_end_ms
    slot, start_ms, end_ms, next_end_ms, pos = unpack_at('<Bddd', batch, pos)
    periods[slot] = {start_ms, end_ms, next_end_ms}
    buckets[slot] = period_of(periods, slot, now)
  end
  shapes[s] = {quotas, plan_count, total_count, index, ends, listed, periods, buckets}
end

-- One pack format per number of quotas checked.
local formats = {}
local answer = {pack('<d', now)}
local REFUND = 2147483648
local CHARGE = 1073741824
local STACK = 536870912

-- The record of the quotas checked since `filled` was reset: admitted u8, Q u8, values.
local function record(admit)
  local checked = (filled - 2) / 3
  values[1], values[2] = admit and 1 or 0, checked
  local format = formats[checked]
  if format == nil then
    format = '<BB' .. string.rep('ddd', checked)
    formats[checked] = format
  end
  return pack(format, unpack(values, 1, filled))
end

-- Decides a stacked request: `parts` = {key, total key index (0 = none), shape,
-- shadow} per policy. Returns the records, one per policy.
local function stacked(cost, parts)
  local rooms, records, all = {}, {}, true
  for i, part in ipairs(parts) do
    local s = part[3]
    day_index, day_end, period_bucket = s[4], s[5], s[8]
    filled = 2
    local room = check(part[1], cost, s[1], 1, s[2])
    if room and s[3] > 0 and part[2] > 0 then
      room = check(keys[part[2]], cost, s[1], s[2] + 1, s[2] + s[3])
    end
    rooms[i] = room
    if not room and part[4] == 0 then all = false end
    records[i] = record(room)
  end
  if all and cost > 0 then
    for i, part in ipairs(parts) do
      if rooms[i] then
        local s = part[3]
        day_index, day_end, period_bucket = s[4], s[5], s[8]
        commit(part[1], cost, s[1], 1, s[2])
        if s[3] > 0 and part[2] > 0 then commit(keys[part[2]], cost, s[1], s[2] + 1, s[2] + s[3]) end
      end
    end
  end
  return table.concat(records)
end
for r = 1, n do
  local cost, caller_at, total_at, shape_at, at
  cost, caller_at, total_at, shape_at, pos = unpack_at('<I4HHH', batch, pos)
  local shape = shapes[shape_at]
  local quotas, plan_count, total_count = shape[1], shape[2], shape[3]
  day_index, day_end, period_bucket = shape[4], shape[5], shape[8]
  local caller_key = keys[caller_at]

  filled = 2
  local admit = true
  local answered = nil
  if cost >= REFUND then
    cost = cost - REFUND
    at, pos = unpack_at('<d', batch, pos)
    if at < 0 then
      give_back(caller_key, cost, quotas, 1, plan_count)
      if total_count > 0 then
        give_back(keys[total_at], cost, quotas, plan_count + 1, plan_count + total_count)
      end
    else
      uncount(caller_key, cost, at, shape[6], shape[7], quotas, 1, plan_count)
      if total_count > 0 then
        uncount(keys[total_at], cost, at, shape[6], shape[7], quotas, plan_count + 1, plan_count + total_count)
      end
    end
  elseif cost >= CHARGE then
    cost = cost - CHARGE
    check(caller_key, cost, quotas, 1, plan_count)
    commit(caller_key, cost, quotas, 1, plan_count)
    if total_count > 0 then
      local total_key = keys[total_at]
      check(total_key, cost, quotas, plan_count + 1, plan_count + total_count)
      commit(total_key, cost, quotas, plan_count + 1, plan_count + total_count)
    end
  elseif cost >= STACK then
    cost = cost - STACK
    local lead_shadow, m
    lead_shadow, m, pos = unpack_at('<BB', batch, pos)
    local parts = {{caller_key, total_at, shape, lead_shadow}}
    for _ = 1, m do
      local key_at, member_shape, member_shadow
      key_at, member_shape, member_shadow, pos = unpack_at('<HHB', batch, pos)
      parts[#parts + 1] = {keys[key_at], 0, shapes[member_shape], member_shadow}
    end
    answered = late and LATE or stacked(cost, parts)
  elseif late then
    answered = LATE
  else
    admit = check(caller_key, cost, quotas, 1, plan_count)
    if admit and total_count > 0 then
      local total_key = keys[total_at]
      admit = check(total_key, cost, quotas, plan_count + 1, plan_count + total_count)
      if admit and cost > 0 then commit(total_key, cost, quotas, plan_count + 1, plan_count + total_count) end
    end
    if admit and cost > 0 then commit(caller_key, cost, quotas, 1, plan_count) end
  end
  answer[r + 1] = answered or record(admit)
end

-- Write back what changed: one HSET per key, and its TTL when a run was created.
for _, key in ipairs(touched) do
  local k = cache[key]
  if k[3] then
    local extend = now + k[2] > k[1]
    if extend then k[1] = now + k[2] + 1000 end
    local parts, count = {}, 0
    for slot, st in pairs(k[4]) do
      count = count + 1
      parts[count + 1] = pack('<Bddddd', slot, st[1], st[2], st[3], st[4], st[5])
    end
    parts[1] = pack('<dB', k[1], count)
    redis.call('HSET', key, 'm', table.concat(parts))
    if extend then redis.call('PEXPIRE', key, k[2] + 1000) end
  end
end
return table.concat(answer)
