# shellcheck shell=bash
# Shell functions of the side-by-side benchmarks (bench/peer.sh, bench/quant.sh, bench/moe.sh,
# bench/families.sh, bench/window_memory.sh, bench/window_prefix.sh): their common environment
# and set-up, starting kvserve or llama-server on a model, waiting for it, one closed-loop client
# run, a round of both servers, ratios.
# Source it from the repository root (after `cd "$ROOT"`), then call peer_setup. It sets the
# defaults every one of them documents: BUILD (build), THREADS (nproc), PEER
# (../shared/peer/llama.cpp/bin), VOCAB (llama-spm), and the binaries' paths KVSERVE, MKMODEL,
# MACHINE, ENGINE under BUILD; WHO (the script's name, for messages).
# shellcheck disable=SC2034 # used by the scripts that source this file
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
PEER=${PEER:-../shared/peer/llama.cpp/bin}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
KVSERVE="$BUILD/server/kvserve"
# shellcheck disable=SC2034
MKMODEL="$BUILD/tools/kvs-mkmodel"
# shellcheck disable=SC2034
MACHINE="$BUILD/bench/kvs-bench-machine"
# shellcheck disable=SC2034
ENGINE="$BUILD/bench/kvs-bench-engine"
WHO=$(basename "$0")

# peer_setup [BINARY...] [--peer TOOL...] [--vocab]: exits 1 with a message unless each BINARY
# is executable (ninja -C BUILD builds it), each TOOL is in PEER and, with --vocab, VOCAB
# exists; then TMP (a fresh directory), PIDS (an array: start_server adds every server it
# starts) and an EXIT trap that kills PIDS and removes TMP, and LOAD_BEFORE (the load average
# now: the machine may be shared, so every table says it).
peer_setup() {
    local x in_peer=0
    for x in "$@"; do
        case $x in
        --peer) in_peer=1 ;;
        --vocab) [ -f "$VOCAB" ] || { echo "$WHO: vocabulary $VOCAB not found" >&2; exit 1; } ;;
        *)
            if [ "$in_peer" = 1 ]; then
                [ -x "$PEER/$x" ] || { echo "$WHO: no $x in $PEER: nothing to compare" >&2; exit 1; }
            else
                [ -x "$x" ] || { echo "$WHO: $x missing (ninja -C $BUILD)" >&2; exit 1; }
            fi
            ;;
        esac
    done
    TMP=$(mktemp -d "/tmp/kvs-bench-${WHO%.sh}.XXXXXX")
    PIDS=()
    # shellcheck disable=SC2154 # p is the trap's own loop variable
    trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT
    # shellcheck disable=SC2034
    LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
}

# make_model [KVS-MKMODEL ARGS...]: SHAPE written in F16 by kvs-mkmodel (random weights, VOCAB,
# with ARGS), then TYPE made from it by llama-quantize (TYPE F16: that file itself); sets MODEL
# (under TMP) (depth.sh, score.sh, embed.sh)
make_model() {
    MODEL="$TMP/$SHAPE-f16.gguf"
    "$MKMODEL" --shape "$SHAPE" --type f16 --vocab "$VOCAB" "$@" -o "$MODEL" >&2
    if [ "$TYPE" != F16 ]; then
        "$PEER/llama-quantize" "$MODEL" "$TMP/$SHAPE-$TYPE.gguf" "$TYPE" "$THREADS" >/dev/null 2>&1
        rm -f "$MODEL"
        MODEL="$TMP/$SHAPE-$TYPE.gguf"
    fi
}

# free_port: a loopback port nobody listens on now (the machine is shared: a fixed one may be
# taken)
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_health PORT LOG PID: until /health answers while PID lives (so it is our server, not
# another one on the port; 3 minutes at most; else LOG's tail and exit 1)
wait_health() {
    for _ in $(seq 900); do
        kill -0 "$3" 2>/dev/null || { echo "$WHO: server exited:" >&2; tail -5 "$2" >&2; exit 1; }
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "$WHO: server on $1 did not start:" >&2; tail -20 "$2" >&2; exit 1
}

# start_server kvserve|llama MODEL PORT LOG [KVSERVE ARGS...]: both with THREADS threads and
# room for 16 sequences of 1024 tokens; sets SERVER_PID once /health answers.
start_server() {
    local who=$1 model=$2 port=$3 log=$4
    shift 4
    if [ "$who" = kvserve ]; then
        "$KVSERVE" serve -m "$model" --port "$port" --threads "$THREADS" --max-num-seqs 16 \
            --ctx-size 1024 --log-level warn "$@" 2>"$log" &
    else
        # --no-mmap: llama-server reads the weights into its own buffers, as kvserve does. Mapped,
        # it decoded a TinyLlama F16 file written a minute before at 6.8-9.2 tok/s and the same
        # bytes written hours before at 14.6 (Zen 5, one client; --no-mmap 14.5 on the new
        # file): the page cache of a file just written slows its reads, and every script here
        # writes its models fresh (docs/BENCHMARKS.md, top).
        "$PEER/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -tb "$THREADS" -np 16 -c $((16 * 1024)) --no-mmap --no-webui >"$log" 2>&1 &
    fi
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_health "$port" "$log" "$SERVER_PID"
}

# stop_server: the one start_server started
stop_server() {
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
}

# bench PORT CONCURRENCY N INPUT OUTPUT -> "output-tok/s input-tok/s" of one closed-loop run
# (bench/serve_bench.py, non-streaming completions, token-id prompts, ignore_eos).
# - The prompts' seed comes from CONCURRENCY, N and INPUT, so a warm-up (1 request) and the runs
#   after it send different prompts: with one seed for all, the warm-up's prompt came back as
#   the first measured request, a whole-prompt cache hit on both servers, and the 16 clients'
#   first prompts were the 1 client's.
# - BAN_TOKENS (3-258, the llama-spm vocabulary's byte tokens, which every model these scripts
#   write has; "" none) get logit_bias -100: a random-weights model emits stray bytes, invalid
#   UTF-8, and llama-server fails such a request with a 500 after generating it ("does not match
#   the expected Content-only format"). Up to 2026-12-06 these scripts sent no bias: 2-5 of 16
#   requests failed there, their tokens went uncounted, and llama-server's 16-client figures
#   read 52-73 tok/s where it serves 96-107 (TinyLlama Q4_K_M, Zen 5).
# - A run with any failed request stops the script (the figure would count only the rest).
BAN_TOKENS=${BAN_TOKENS-3-258}
bench() {
    local ban=()
    [ -z "$BAN_TOKENS" ] || ban=(--ban-tokens "$BAN_TOKENS")
    python3 bench/serve_bench.py --url "http://127.0.0.1:$1" --concurrency "$2" \
        --num-requests "$3" --input-len "$4" --output-len "$5" --json "$TMP/r.json" \
        --seed $(($2 * 100000 + $3 * 1000 + $4)) "${ban[@]}" >/dev/null || true
    if ! python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(s["failed"] != 0)' "$TMP/r.json"; then
        echo "$WHO: port $1: requests failed ($(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["failed"], "of", s["failed"] + s["completed"], s["errors"][:1])' "$TMP/r.json")); stopping" >&2
        kill -TERM $$
        exit 1
    fi
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.1f %.1f" % (s["output_throughput"], s["total_token_throughput"] - s["output_throughput"]))' "$TMP/r.json"
}

# pair_round MODEL KPORT LPORT R [KVSERVE ARGS...] -> "k1 k16 kpp krss l1 l16 lpp lrss": kvserve
# (with ARGS) and llama-server up at once on MODEL; then each load level measured on both back to
# back: 1 client (N1 requests) and 16 clients (N16), PROMPT-token prompts and OUT tokens each
# (tok/s), and NPP 512-token prompts of 1 token (prompt tok/s); each server's resident MiB after
# them. kvserve goes first in odd rounds, llama-server in even ones: the two figures of a ratio
# are seconds apart, not a server's whole run apart (this machine's read bandwidth moves by 2x
# within minutes), and neither server always goes first (peer.sh, quant.sh, moe.sh)
pair_round() {
    local model=$1 kport=$2 lport=$3 r=$4 kpid lpid p order
    shift 4
    local -A one sixteen pp rss
    start_server kvserve "$model" "$kport" "$TMP/kvserve-$kport.log" "$@"
    kpid=$SERVER_PID
    start_server llama "$model" "$lport" "$TMP/llama-$lport.log"
    lpid=$SERVER_PID
    order=("$kport" "$lport")
    [ $((r % 2)) = 1 ] || order=("$lport" "$kport")
    for p in "${order[@]}"; do bench "$p" 1 1 8 4 >/dev/null; done # warm-ups
    for p in "${order[@]}"; do one[$p]=$(bench "$p" 1 "$N1" "$PROMPT" "$OUT" | cut -d' ' -f1); done
    for p in "${order[@]}"; do
        sixteen[$p]=$(bench "$p" 16 "$N16" "$PROMPT" "$OUT" | cut -d' ' -f1)
    done
    for p in "${order[@]}"; do pp[$p]=$(bench "$p" 1 "$NPP" 512 1 | cut -d' ' -f2); done
    rss[$kport]=$(awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$kpid/status")
    rss[$lport]=$(awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$lpid/status")
    kill "$kpid" "$lpid"
    wait "$kpid" "$lpid" 2>/dev/null || true
    echo "${one[$kport]} ${sixteen[$kport]} ${pp[$kport]} ${rss[$kport]} ${one[$lport]} ${sixteen[$lport]} ${pp[$lport]} ${rss[$lport]}"
}

# median <<<"WORDS" -> the median of the numbers in WORDS (the lower one of an even count),
# one decimal: the figure of REPEATS rounds (peer.sh, quant.sh, depth.sh)
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {printf "%.1f", a[int((NR + 1) / 2)]}'; }

# cpu_desc -> "MODEL NAME (FLAGS)": the CPU and the instruction sets its kernels can use, for the
# "Measured ... on" line of a section (the CPU kind decides which section, bench/doc_section.py)
cpu_desc() {
    local cpu flags
    cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    flags=$(grep -m1 '^flags' /proc/cpuinfo | grep -o 'avx512[a-z_0-9]*\|avx2\|fma\|f16c\|avx_vnni' | sort -u | tr '\n' ' ')
    echo "$cpu (${flags% })"
}

# ratio A B -> A / B with two decimals (0 when B is 0)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}'; }
