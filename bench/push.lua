-- wrk script: POST /api/v1/push with ITEMS items per request spread over PARTITIONS
-- partitions, ~100-byte JSON payloads and unique transactionIds (DUP=1 repeats each
-- transactionId once, so half of the pushes are duplicates).
local items = tonumber(os.getenv("ITEMS") or "1")
local partitions = tonumber(os.getenv("PARTITIONS") or "10")
local queue = os.getenv("QUEUE") or "bench"
local dup = os.getenv("DUP") == "1"
local run_tag = os.getenv("TAG") or tostring(os.time())
local counter = 0
local thread_tag = ""
local threads = 0

-- Every wrk run and every thread gets its own transactionId space (TAG, else the clock).
function setup(thread)
  threads = threads + 1
  thread:set("thread_tag", run_tag .. "-" .. threads)
end

request = function()
  counter = counter + 1
  local seq = counter
  if dup then seq = math.floor((counter + 1) / 2) end
  local parts = {}
  for i = 1, items do
    local n = seq * items + i
    parts[i] = string.format(
      '{"queue":"%s","partition":"p%d","payload":{"orderId":%d,"total":4200,"customer":"cust-%d","note":"benchmark payload xxxxxxxxxx"},"transactionId":"%s-%d-%d"}',
      queue, n % partitions, n, n % 997, thread_tag, seq, i)
  end
  return wrk.format("POST", "/api/v1/push", {["Content-Type"] = "application/json"},
    '{"items":[' .. table.concat(parts, ",") .. ']}')
end
