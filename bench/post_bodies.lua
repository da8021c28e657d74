-- wrk script: POST pre-built JSON bodies (one per line of a file), cycling, with an optional API key.
--   wrk -t1 -c16 -d5s --latency -s bench/post_bodies.lua URL -- BODIES_FILE [API_KEY]
-- Each thread starts at a different offset; done() prints one machine-readable line:
--   WRK {"requests":N,"duration_us":N,"errors":N,"non2xx":N,"p50_us":N,"p99_us":N}
local bodies = {}
local headers = {["Content-Type"] = "application/json"}
local index = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("offset", threads)
end

function init(args)
  for line in io.lines(args[1]) do
    if #line > 0 then bodies[#bodies + 1] = line end
  end
  if args[2] ~= nil and #args[2] > 0 then headers["X-API-Key"] = args[2] end
  index = ((offset or 0) * 7919) % #bodies
end

function request()
  index = index % #bodies + 1
  return wrk.format("POST", nil, headers, bodies[index])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"errors":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50.0), latency:percentile(99.0)))
end
