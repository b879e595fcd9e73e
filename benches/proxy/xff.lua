-- wrk script for benches/proxy/compare.sh: every request carries a different
-- X-Forwarded-For, cycling through CALLERS distinct addresses 10.x.y.z
-- (default 1 000 000). The addresses are visited with a stride coprime with
-- CALLERS, a permutation, so consecutive requests do not hit neighbouring keys and
-- every address is used once per CALLERS requests.
--
-- CALLERS=1 sends one constant address through the same per-request Lua path: the
-- single-caller baseline that the 1M-caller run is compared with, so that wrk's Lua
-- cost is the same on both sides of the ratio.
local callers = tonumber(os.getenv("CALLERS") or "") or 1000000
assert(callers >= 1 and callers <= 16777215, "CALLERS must be in 1..16777215")

local function gcd(a, b)
  while b ~= 0 do
    a, b = b, a % b
  end
  return a
end

local stride = 7919
while callers > 1 and gcd(stride, callers) ~= 1 do
  stride = stride + 2
end

local threads = 0
function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

local n = 0
function init(args)
  -- Each thread (and each run) starts at a different place in the cycle.
  local id = thread_id or 0
  n = (id * 104729 + os.time() * 7919) % callers
end

function request()
  n = (n + stride) % callers
  local a = n + 1 -- 10.0.0.1 upwards
  local ip = string.format("10.%d.%d.%d",
    math.floor(a / 65536) % 256, math.floor(a / 256) % 256, a % 256)
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = ip })
end
