-- The requests of one load for wrk (bench/wrk.ts, one thread), and its result as one JSON line.
-- BENCH_WRK_KIND: get (wrk's own precomputed request), post, patch (a random id of 1 to update_rows), delete (each
-- id of the delete range once), mixed (every ONE_WRITE_IN-th request a POST, the rest GET) or writes (every
-- ONE_WRITE_IN-th request a write: a create, an update and a delete in turn, the rest GET).
local function number(name)
  return tonumber(os.getenv(name))
end

local kind = os.getenv("BENCH_WRK_KIND")
local update_rows = number("BENCH_WRK_UPDATE_ROWS")
local delete_first = number("BENCH_WRK_DELETE_FIRST")
local delete_count = number("BENCH_WRK_DELETE_COUNT")
local delete_stream = number("BENCH_WRK_DELETE_STREAM")
local delete_streams = number("BENCH_WRK_DELETE_STREAMS")
local delete_step = number("BENCH_WRK_DELETE_STEP")
local delay_ms = number("BENCH_WRK_DELAY_MS")
local SEED_PER_STREAM = 7919
local ONE_WRITE_IN = 20

local get_request
local json_headers = {}
local patch_headers = {}
local sent = 0
local deleted = 0
local write_turn = 0

function init(args)
  math.randomseed(os.time() + delete_stream * SEED_PER_STREAM)
  get_request = wrk.format("GET", wrk.path)
  for name, value in pairs(wrk.headers) do
    json_headers[name] = value
    patch_headers[name] = value
  end
  json_headers["Content-Type"] = "application/json"
  patch_headers["Content-Type"] = "application/merge-patch+json"
end

local function create()
  local body = '{"name":"bench ' .. sent .. '","description":"created by the benchmark"}'
  return wrk.format("POST", wrk.path, json_headers, body)
end

local function update()
  local id = math.random(update_rows)
  return wrk.format("PATCH", wrk.path .. "/" .. id, patch_headers, '{"name":"bench ' .. sent .. '"}')
end

local function delete()
  local index = deleted * delete_streams + delete_stream
  deleted = deleted + 1
  local id = delete_first + (index * delete_step) % delete_count
  return wrk.format("DELETE", wrk.path .. "/" .. id)
end

local function write()
  write_turn = write_turn % 3 + 1
  if write_turn == 1 then return create() end
  if write_turn == 2 then return update() end
  return delete()
end

local write_of = { post = create, patch = update, delete = delete, mixed = create, writes = write }
local one_write_in = (kind == "mixed" or kind == "writes") and ONE_WRITE_IN or 1

-- Only a script with a request() function makes wrk build every request anew; GET keeps the static one.
if write_of[kind] ~= nil then
  function request()
    sent = sent + 1
    if sent % one_write_in == 0 then return write_of[kind]() end
    return get_request
  end
end

if delay_ms > 0 then
  function delay()
    return delay_ms
  end
end

local US_PER_MS = 1000
local US_PER_S = 1000000

-- The result as bench/wrk.ts's LoadResult, but for wrk's CPU.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"total":%d,"rps":%.1f,"p50":%.1f,"p99":%.1f,"failures":%d,"bytesPerResponse":%d}\n',
    summary.requests, summary.requests / summary.duration * US_PER_S,
    latency:percentile(50) / US_PER_MS, latency:percentile(99) / US_PER_MS,
    e.connect + e.read + e.write + e.timeout + e.status, math.floor(summary.bytes / math.max(summary.requests, 1))))
end
