-- wrk script: one fixed request (method, body file, Content-Type from the environment), and a
-- one-line JSON summary on stdout at the end for bench/load.py to parse.
--   BENCH_METHOD (POST), BENCH_BODY (path of the body file, optional), BENCH_CONTENT_TYPE, BENCH_THINK_MS
wrk.method = os.getenv("BENCH_METHOD") or "POST"
local path = os.getenv("BENCH_BODY")
if path and path ~= "" then
  local f = assert(io.open(path, "rb"))
  wrk.body = f:read("*a")
  f:close()
end
local ctype = os.getenv("BENCH_CONTENT_TYPE")
if ctype and ctype ~= "" then
  wrk.headers["Content-Type"] = ctype
end
-- BENCH_THINK_MS: each connection waits this long after an answer before its next request (a client
-- that does something between requests, as most do; wrk's delay() has millisecond granularity)
local think = tonumber(os.getenv("BENCH_THINK_MS") or "")
if think and think > 0 then
  function delay()
    return think
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
