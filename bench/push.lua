-- wrk script: POST /api/v1/push bodies for the benchmark.
--
-- Environment:
--   ITEMS       items per request (default 1)
--   PARTITIONS  the items go to partitions p0..p(PARTITIONS-1), round-robin (default 10)
--   QUEUE       queue name (default "bench")
--   TAG         prefix of every transactionId; give every wrk run a new one, or a run sends
--               the transactionIds of the previous one and pushes nothing but duplicates
--   DUP=1       every request is sent twice with the same items: half the pushes duplicate
--   START       requests to skip: a run that continues another one's partition rotation
--
-- Payloads are ~100-byte JSON objects. transactionIds are TAG-<thread>-<item number>, so they
-- are unique inside one run (and across runs with different TAGs).
local items = tonumber(os.getenv("ITEMS") or "1")
local partitions = tonumber(os.getenv("PARTITIONS") or "10")
local queue = os.getenv("QUEUE") or "bench"
local tag = os.getenv("TAG") or tostring(os.time())
local dup = os.getenv("DUP") == "1"
local headers = {["Content-Type"] = "application/json"}

local threads_created = 0
function setup(thread)
  threads_created = threads_created + 1
  -- a global of that thread's Lua state (read below as thread_no)
  thread:set("thread_no", threads_created)
end

local item_head = '{"queue":"' .. queue .. '","partition":"p'
local counter = tonumber(os.getenv("START") or "0")

request = function()
  counter = counter + 1
  local seq = counter
  if dup then seq = math.floor((counter + 1) / 2) end
  local prefix = tag .. "-" .. tostring(thread_no or 0) .. "-"
  local parts = {}
  for i = 1, items do
    local n = (seq - 1) * items + i
    parts[i] = string.format(
      '%s%d","payload":{"orderId":%d,"total":4200,"customer":"cust-%03d",' ..
      '"note":"benchmark payload, about one hundred bytes"},"transactionId":"%s%d"}',
      item_head, n % partitions, n, n % 997, prefix, n)
  end
  return wrk.format("POST", "/api/v1/push", headers,
    '{"items":[' .. table.concat(parts, ",") .. ']}')
end
