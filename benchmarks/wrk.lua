-- benchmarks/load.py's wrk step: sends the prepared raw requests in turn, counts what came back, and prints one
-- JSON line at the end.   wrk -c C -t T -d Ns -s wrk.lua URL -- <folder of 1.http .. N.http> <N>
local threads, counts = {}, {"statuses", "variants", "batch_sizes"}

local function add(t, key, n) t[key] = (t[key] or 0) + (n or 1) end

local function json(t)
  local out = {}
  for k, v in pairs(t) do table.insert(out, string.format("%q:%s", k, v ~= v and "null" or tostring(v))) end
  return "{" .. table.concat(out, ",") .. "}"
end

function setup(thread)
  thread:set("first", #threads)
  table.insert(threads, thread)
end

function init(args)
  requests, statuses, variants, batch_sizes, index = {}, {}, {}, {}, first
  for k = 1, tonumber(args[2]) do
    local f = assert(io.open(args[1] .. "/" .. k .. ".http", "rb"))
    requests[k] = f:read("*a")
    f:close()
  end
end

function request()
  index = index % #requests + 1
  return requests[index]
end

function response(status, headers, body)
  add(statuses, tostring(status))
  if status ~= 200 then return end
  for name, value in pairs(headers) do if name:lower() == "x-model-variant" then add(variants, value) end end
  for size in body:gmatch('"batch_size":%s*(%d+)') do add(batch_sizes, size) end
end

function done(summary, latency)
  local out = {requests = summary.requests, duration_us = summary.duration}
  for _, name in ipairs(counts) do
    local all = {}
    for _, thread in ipairs(threads) do for k, n in pairs(thread:get(name)) do add(all, k, n) end end
    out[name] = json(all)
  end
  local e, lat = summary.errors, {max = latency.max}
  for _, p in ipairs({50, 90, 99}) do lat["p" .. p] = latency:percentile(p) end
  out.latency_us, out.socket = json(lat), json({connect = e.connect, read = e.read, write = e.write, timeout = e.timeout})
  print(json(out))
end
