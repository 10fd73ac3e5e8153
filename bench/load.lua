-- wrk script: POST /v1/completions with a short output, counting responses by status.
-- Usage: wrk -t2 -c256 -d60s -s bench/load.lua http://127.0.0.1:PORT/v1/completions
-- Prints one "status CODE COUNT" line per status seen and one "errors ..." line, which
-- bench/load_test.py parses (wrk itself only reports "Non-2xx or 3xx responses").
wrk.method = "POST"
wrk.body = '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}'
wrk.headers["Content-Type"] = "application/json"

local threads = {}

function setup(thread)
    table.insert(threads, thread)
end

function init(args)
    statuses = {}
end

function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
    local total = {}
    for _, t in ipairs(threads) do
        for code, n in pairs(t:get("statuses")) do
            total[code] = (total[code] or 0) + n
        end
    end
    for code, n in pairs(total) do
        io.write(string.format("status %d %d\n", code, n))
    end
    local e = summary.errors
    io.write(string.format("errors connect %d read %d write %d timeout %d\n",
                           e.connect, e.read, e.write, e.timeout))
    io.write(string.format("latency p50 %.1f ms p99 %.1f ms max %.1f ms\n",
                           latency:percentile(50) / 1000, latency:percentile(99) / 1000,
                           latency.max / 1000))
end
