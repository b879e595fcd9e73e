-- sluice: decide one request against a caller's windows and a policy's total,
-- all or nothing, with Redis's own clock. The same algorithm as src/limit/runs.rs.
--
-- KEYS[1]  the caller's counters: a hash of "slot:bucket_ms:bucket" -> count
-- KEYS[2]  the policy's total counters (present when the policy has a total)
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

-- When a run stops counting, 0 if it already has.
local function expires_in(slot, bucket_ms, bucket, length_ms)
  if slot == 4 then
    if bucket >= day_index then return math.max(day_end - now, 1) end
    return 0
  end
  local ends = (bucket + 1) * bucket_ms + length_ms - 1 - now
  if ends < 0 then return 0 end
  return ends
end

local function current(slot, bucket_ms)
  if slot == 4 then return day_index end
  return math.floor(now / bucket_ms)
end

-- The live runs of every slot, oldest expiry first; expired fields are deleted
-- when the call may write.
local function load(key)
  local flat = redis.call('HGETALL', key)
  local slots = {}
  for i = 1, #flat, 2 do
    local slot, bucket_ms, bucket = string.match(flat[i], '^(%d+):(%d+):(%d+)$')
    if slot then
      slot, bucket_ms, bucket = tonumber(slot), tonumber(bucket_ms), tonumber(bucket)
      local length_ms = 0
      -- The window length of a sliding slot is fixed by the slot.
      if slot == 0 then length_ms = 1000 elseif slot == 1 then length_ms = 60000
      elseif slot == 2 then length_ms = 3600000 elseif slot == 3 then length_ms = 86400000 end
      local left = expires_in(slot, bucket_ms, bucket, length_ms)
      if left > 0 then
        slots[slot] = slots[slot] or {}
        table.insert(slots[slot], {left, tonumber(flat[i + 1])})
      elseif cost > 0 then
        redis.call('HDEL', key, flat[i])
      end
    end
  end
  for _, runs in pairs(slots) do
    table.sort(runs, function(a, b) return a[1] < b[1] end)
  end
  return slots
end

local function check(slots, first, count, out)
  local admit = true
  for q = first, first + count - 1 do
    local at = 4 + 4 * q
    local slot, limit = tonumber(ARGV[at]), tonumber(ARGV[at + 1])
    local bucket_ms, length_ms = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    local runs = slots[slot] or {}
    local used = 0
    for _, run in ipairs(runs) do used = used + run[2] end
    local reset
    if #runs > 0 then reset = runs[1][1]
    else reset = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms), length_ms), 1) end
    local retry = -1
    if used + cost > limit then
      admit = false
      local left = used
      for _, run in ipairs(runs) do
        left = left - run[2]
        if left + cost <= limit then retry = math.max(run[1], 1) break end
      end
      if retry < 0 then
        retry = math.max(expires_in(slot, bucket_ms, current(slot, bucket_ms), length_ms), 1)
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
    local slot, bucket_ms, length_ms = tonumber(ARGV[at]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    local bucket = current(slot, bucket_ms)
    local field
    if slot == 4 then field = '4:0:' .. bucket else field = slot .. ':' .. bucket_ms .. ':' .. bucket end
    redis.call('HINCRBY', key, field, cost)
    ttl = math.max(ttl, expires_in(slot, bucket_ms, bucket, length_ms))
  end
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl + 1000)
  end
end

local out = {}
local admit = check(load(KEYS[1]), 0, plan_count, out)
if admit and total_count > 0 then
  admit = check(load(KEYS[2]), plan_count, total_count, out)
  if admit and cost > 0 then commit(KEYS[2], plan_count, total_count) end
end
if admit and cost > 0 then commit(KEYS[1], 0, plan_count) end
local answer = {0, now}
if admit then answer[1] = 1 end
for _, value in ipairs(out) do table.insert(answer, value) end
return answer
