-- The bench's second load client for the matrix's pooled shape (bench/wrkmix.py):
-- wrk sends each request with a token drawn at random, then one of that token's keys
-- by weight, from the keys file bench/mix.py writes (bench/loadgen.c's header gives
-- its format). Environment: MIX_KEYS (the file), MIX_SEED (default 1),
-- MIX_GZIP_SHARE (the share of requests sent with Accept-Encoding: gzip, default 0).
-- Each wrk thread has a Lua state of its own: each reads the file once, in init, and
-- builds every request there, so request() only draws.

local keys_path = os.getenv("MIX_KEYS")
local seed = tonumber(os.getenv("MIX_SEED") or "1")
local gzip_share = tonumber(os.getenv("MIX_GZIP_SHARE") or "0")
local started = 0
local tokens = {}

function setup(thread)
   started = started + 1
   thread:set("thread_id", started)
end

function init(args)
   math.randomseed(seed * 7919 + (thread_id or 0))
   local current = nil
   for line in io.lines(keys_path) do
      if line:sub(1, 6) == "token " then
         current = {total = 0, cumulative = {}, plain = {}, gzip = {}}
         current.authorization = line:sub(7)
         tokens[#tokens + 1] = current
      elseif #line > 0 and line:sub(1, 1) ~= "#" then
         local weight, target = line:match("^(%S+) (%S+)$")
         if current == nil or weight == nil then
            error("mix.lua: not a keys file line: " .. line)
         end
         current.total = current.total + tonumber(weight)
         current.cumulative[#current.cumulative + 1] = current.total
         local headers = {Authorization = current.authorization}
         current.plain[#current.plain + 1] = wrk.format("GET", target, headers)
         headers["Accept-Encoding"] = "gzip"
         current.gzip[#current.gzip + 1] = wrk.format("GET", target, headers)
      end
   end
   if #tokens == 0 then
      error("mix.lua: no token in " .. tostring(keys_path))
   end
end

function request()
   local token = tokens[math.random(#tokens)]
   local point = math.random() * token.total
   local low, high = 1, #token.cumulative
   while low < high do
      local middle = math.floor((low + high) / 2)
      if token.cumulative[middle] > point then
         high = middle
      else
         low = middle + 1
      end
   end
   if math.random() < gzip_share then
      return token.gzip[low]
   end
   return token.plain[low]
end

function done(summary, latency, requests)
   local seconds = summary.duration / 1e6
   local errors = summary.errors
   io.write(string.format(
      'MIXJSON {"requests": %d, "duration_s": %.6f, "requests_per_s": %.1f, ' ..
      '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
      '"latency_ms": {"p50": %.4f, "p99": %.4f, "p999": %.4f}}\n',
      summary.requests, seconds, summary.requests / seconds,
      errors.connect, errors.read, errors.write, errors.status, errors.timeout,
      latency:percentile(50) / 1000, latency:percentile(99) / 1000,
      latency:percentile(99.9) / 1000))
end
