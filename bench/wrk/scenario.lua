-- The requests of one bench scenario for wrk, and its result as one JSON line (bench/wrk.ts).
-- BENCH_WRK_KIND: get (wrk's own precomputed request), post (a unique name per
-- request) or mixed (every BENCH_WRK_POST_EVERY-th request a POST, the rest GET).
-- BENCH_WRK_PREFIX makes the names unique across scenarios and runs.
local kind = os.getenv("BENCH_WRK_KIND") or "get"
local every = tonumber(os.getenv("BENCH_WRK_POST_EVERY") or "20")
local prefix = os.getenv("BENCH_WRK_PREFIX") or "wrk"

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_number", thread_count)
end

local get_request
local post_headers = {}
local sent = 0
local name_prefix

function init(args)
  name_prefix = prefix .. "-t" .. tostring(thread_number or 0) .. "-"
  get_request = wrk.format("GET", wrk.path)
  for name, value in pairs(wrk.headers) do post_headers[name] = value end
  post_headers["Content-Type"] = "application/json"
end

local function post()
  return wrk.format("POST", wrk.path, post_headers,
    '{"name":"' .. name_prefix .. sent .. '","description":"created by the benchmark"}')
end

-- Only a script with a request() function makes wrk build every request anew; GET keeps the static one.
if kind == "post" then
  function request()
    sent = sent + 1
    return post()
  end
elseif kind == "mixed" then
  function request()
    sent = sent + 1
    if sent % every == 0 then return post() end
    return get_request
  end
end

-- CPU ticks (user + system, all threads) of this wrk process, from /proc/self/stat.
local function cpu_ticks()
  local file = io.open("/proc/self/stat")
  if file == nil then return -1 end
  local stat = file:read("*a")
  file:close()
  local fields = {}
  for field in stat:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = field end
  return tonumber(fields[12]) + tonumber(fields[13])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"durationUs":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,"p50Us":%d,"p99Us":%d,"cpuTicks":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), cpu_ticks()))
end
