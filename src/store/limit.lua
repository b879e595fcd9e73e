-- sluice: decide one request against a caller's windows and a policy's total,
-- all or nothing, with Redis's own clock. The same algorithm as src/limit/runs.rs.
--
-- KEYS[1]  the caller's counters, KEYS[2] the policy's total counters (a dummy key
--          when the policy has no total). Each is a hash:
--            "slot:bucket_ms:bucket" -> count   one run (bucket_ms 1 = exact ms;
--                                               slot 4 = calendar day, bucket = day)
--            "slot:sum"                -> requests counted in the slot's live runs
--            "slot:next"               -> ms at which the slot's oldest run expires
--          so a request reads two fields per window; the runs are only listed when
--          something has expired or a refusal needs its exact wait.
-- ARGV[1]  cost (0 = only report, count nothing)
-- ARGV[2]  P, the number of plan quotas; ARGV[3] T, the number of total quotas
-- then P + T quotas of 4 values: slot (0-3 sliding, 4 calendar day), limit,
--          bucket_ms (1 = exact milliseconds), window length_ms
-- then C, the number of calendar days given, and C x (index, start_ms, end_ms)
--
-- Returns {admitted (0/1), now_ms, then per quota checked: used, reset_ms, retry_ms
-- (-1 when that quota admits)}. Total quotas are reported only if the caller's own
-- quotas admitted.

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local cost = tonumber(ARGV[1])
local plan_count = tonumber(ARGV[2])
local total_count = tonumber(ARGV[3])
local days_at = 4 + 4 * (plan_count + total_count)
local day_index, day_end = -1, now
for i = 0, tonumber(ARGV[days_at]) - 1 do
  local at = days_at + 1 + 3 * i
  local start_ms, end_ms = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if now >= start_ms and now < end_ms then
    day_index, day_end = tonumber(ARGV[at]), end_ms
  end
end
local LENGTHS = {[0] = 1000, [1] = 60000, [2] = 3600000, [3] = 86400000, [4] = 0}

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

-- The live runs of `slot` as {ms left, count}, soonest first; expired runs are
-- deleted and the slot's sum and next expiry rewritten.
local function runs_of(key, slot)
  local flat = redis.call('HGETALL', key)
  local runs, sum, next_at = {}, 0, 0
  for i = 1, #flat, 2 do
    local s, bucket_ms, bucket = string.match(flat[i], '^(%d+):(%d+):(%d+)$')
    if s and tonumber(s) == slot then
      local left = expires_in(slot, tonumber(bucket_ms), tonumber(bucket))
      if left > 0 then
        local count = tonumber(flat[i + 1])
        table.insert(runs, {left, count})
        sum = sum + count
        if next_at == 0 or now + left < next_at then next_at = now + left end
      else
        redis.call('HDEL', key, flat[i])
      end
    end
  end
  table.sort(runs, function(a, b) return a[1] < b[1] end)
  if sum > 0 then
    redis.call('HSET', key, slot .. ':sum', sum, slot .. ':next', next_at)
  else
    redis.call('HDEL', key, slot .. ':sum', slot .. ':next')
  end
  return runs, sum, next_at
end

local function check(key, first, count, out)
  local admit = true
  for q = first, first + count - 1 do
    local at = 4 + 4 * q
    local slot, limit, bucket_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
    local state = redis.call('HMGET', key, slot .. ':sum', slot .. ':next')
    local used, next_at = tonumber(state[1]) or 0, tonumber(state[2]) or 0
    local runs = nil
    if used > 0 and now >= next_at then
      runs, used, next_at = runs_of(key, slot)
    end
    local reset
    if used > 0 then reset = next_at - now
    else reset = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1) end
    local retry = -1
    if used + cost > limit then
      admit = false
      if runs == nil then runs = runs_of(key, slot) end
      local left = used
      for _, run in ipairs(runs) do
        left = left - run[2]
        if left + cost <= limit then retry = math.max(run[1], 1) break end
      end
      if retry < 0 then
        retry = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms)), 1)
      end
    end
    table.insert(out, used)
    table.insert(out, reset)
    table.insert(out, retry)
  end
  return admit
end

local function commit(key, first, count)
  local ttl = 0
  for q = first, first + count - 1 do
    local at = 4 + 4 * q
    local slot, bucket_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 2])
    local bucket = current(slot, bucket_ms)
    local field
    if slot == 4 then field = '4:0:' .. bucket else field = slot .. ':' .. bucket_ms .. ':' .. bucket end
    redis.call('HINCRBY', key, field, cost)
    local left = expires_in(slot, bucket_ms, bucket)
    if redis.call('HINCRBY', key, slot .. ':sum', cost) == cost then
      redis.call('HSET', key, slot .. ':next', now + left)
    end
    ttl = math.max(ttl, left)
  end
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl + 1000)
  end
end

local out = {}
local admit = check(KEYS[1], 0, plan_count, out)
if admit and total_count > 0 then
  admit = check(KEYS[2], plan_count, total_count, out)
  if admit and cost > 0 then commit(KEYS[2], plan_count, total_count) end
end
if admit and cost > 0 then commit(KEYS[1], 0, plan_count) end
local answer = {0, now}
if admit then answer[1] = 1 end
for _, value in ipairs(out) do table.insert(answer, value) end
return answer
