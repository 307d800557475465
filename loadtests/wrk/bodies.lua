-- wrk script: POST JSON bodies drawn in turn from a file (one body per line), count every status.
--   wrk -t1 -cN -dS -s loadtests/wrk/bodies.lua URL -- PATH BODIES_FILE
-- Prints one JSON line at the end: statuses by code, latency percentiles (ms), requests, errors.
-- A closed loop like Locust's users: each connection sends its next request when answered, and
-- honours Retry-After as they do: a connection refused with 429/503 waits that long first.

local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  path = args[1]
  bodies = {}
  for line in io.lines(args[2]) do
    if #line > 0 then bodies[#bodies + 1] = line end
  end
  -- each thread starts at its own offset, so threads do not send the same bodies in lockstep
  n = (id * 7919) % #bodies
  statuses = {}
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  n = n % #bodies + 1
  return wrk.format(nil, path, nil, bodies[n])
end

backoff = 0

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 429 or status == 503 then
    local after = headers["retry-after"] or headers["Retry-After"] or "1"
    backoff = (tonumber(after) or 1) * 1000
  end
end

-- called before the next request of the connection whose response() just ran
function delay()
  local ms = backoff
  backoff = 0
  return ms
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do
      total[status] = (total[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(total) do
    parts[#parts + 1] = string.format('"%d": %d', status, count)
  end
  local e = summary.errors
  io.write(string.format(
    '{"statuses": {%s}, "requests": %d, "seconds": %.3f, "p50_ms": %.3f, "p99_ms": %.3f, ' ..
    '"socket_errors": %d}\n',
    table.concat(parts, ", "), summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.connect + e.read + e.write + e.timeout))
end
