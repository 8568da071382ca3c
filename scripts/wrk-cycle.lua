-- wrk script: acquire -> release cycles against pool `bench`, releasing each
-- granted slot with a {"status":200} report. The pool key is the script's
-- first argument: wrk -s scripts/wrk-cycle.lua URL -- KEY
-- (scripts/bench.sh and scripts/callgrind.sh run it).
-- wrk.host is known in init, not when the script loads: formatted earlier,
-- the request would go without a Host header.
local acquire, key
function init(args)
  key = args[1] or "nthpool-bench-key"
  acquire = wrk.format("POST", "/pools/bench/lock/acquire", { ["X-Nthpool-Key"] = key }, "")
end
local slots = {}
function request()
  local slot = table.remove(slots)
  if slot then
    return wrk.format("POST", "/pools/bench/lock/" .. slot .. "/release",
      { ["X-Nthpool-Key"] = key, ["Content-Type"] = "application/json" }, '{"status":200}')
  end
  return acquire
end
function response(status, headers, body)
  local slot = body:match('"slotId":"([^"]+)"')
  if slot then slots[#slots + 1] = slot end
end
