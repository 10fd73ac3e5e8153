-- wrk script: POST /v1/completions with a fixed greedy body. Usage (kvserve on port 8080):
--   wrk -t2 -c8 -d10s -s bench/wrk-completions.lua http://127.0.0.1:8080
-- MAX_TOKENS and STREAM (true/false) come from the environment, e.g. MAX_TOKENS=128.
-- Latency is per request (whole completion); done() prints generated tokens per second.
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "32")
local stream = os.getenv("STREAM") == "true"

wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format(
    '{"prompt": "Once upon a time", "max_tokens": %d, "temperature": 0, "ignore_eos": true, ' ..
    '"stream": %s}', max_tokens, tostring(stream))

function done(summary, latency, requests)
    local secs = summary.duration / 1e6
    io.write(string.format("%d requests, %d errors (status), %.1f req/s, ~%.0f tokens/s\n",
        summary.requests, summary.errors.status, summary.requests / secs,
        summary.requests * max_tokens / secs))
end
