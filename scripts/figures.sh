#!/usr/bin/env bash
# Regenerates every figure README.md quotes, with the machine it ran on and
# that machine's GEMM rate measured in the same run. Each figure comes from
# one command, printed before it runs; the JSON of each lands in $OUT.
#
#   ./scripts/figures.sh            # kernels, default replay, unpaced replay, in-node laru
#   ./scripts/figures.sh --all      # also bench cache on ../shared/data, bench kafka
#                                   # (needs GRFLOW_KAFKA_BROKERS), bench memory (1M
#                                   # requests, long), bench serve, bench cluster and
#                                   # bench allocator on allocator-small, -emb, -tight
#                                   # and -long (~2 h, the four-seed -tight and -long
#                                   # runs ~40 min each)
#
# Not rerun here (README gives each its own command): calibrate --validate,
# training and evaluation, the paper-shaped configs, --release complete.
#
# Figures differ by 1.4x and more between VMs: quote them with the machine
# line and gemm_gflops this script prints.
set -euo pipefail
cd "$(dirname "$0")/.."

all=false
[ "${1:-}" = "--all" ] && all=true
OUT=${OUT:-target/figures/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
bin=./target/release/grflow

log() { printf '\n== %s\n' "$*" >&2; }
run() {
    # run NAME CMD...: prints the command, keeps its JSON in $OUT/NAME.json
    local name=$1
    shift
    log "$*"
    "$@" >"$OUT/$name.json"
}
field() {
    # field FILE EXPR: one value from a JSON file (python3 is on every dev VM)
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$1" "$2"
}

log "cargo build --release --locked"
cargo build --release --locked >&2

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "machine: ${cpu:-unknown}, $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB" | tee "$OUT/machine.txt"

run kernels "$bin" bench kernels --json
echo "gemm_gflops: $(field "$OUT/kernels.json" "d['gemm_gflops']")" | tee -a "$OUT/machine.txt"

# The first command, three times: the paced default and its busy shares.
for i in 1 2 3; do
    run "replay_default_$i" "$bin" replay --json
done
run replay_max "$bin" replay --speed max --json
run replay_event "$bin" replay --speed max --clock event --json

# In-node learned eviction: the default config with laru for EMB and user KV.
laru_cfg="$OUT/laru.toml"
sed -e 's/^emb_policy = "lru"/emb_policy = "laru"/' \
    -e 's/^user_kv_policy = "lru"/user_kv_policy = "laru"/' configs/default.toml >"$laru_cfg"
run replay_laru_max "$bin" replay --speed max --config "$laru_cfg" --json

if $all; then
    data=../shared/data
    if [ -d "$data" ]; then
        run cache_ml100k "$bin" bench cache --trace "$data/ml-100k/ml-100k.inter" \
            --format recbole --noise 0,1 --repeat 5 --json
        run cache_mooncake "$bin" bench cache --trace "$data/mooncake/conversation_trace_part1.jsonl" \
            --format mooncake --noise 0,1 --repeat 5 --json
    else
        log "skipped bench cache: $data is not here"
    fi
    if [ -n "${GRFLOW_KAFKA_BROKERS:-}" ]; then
        # Three pairs and their medians: the serving-core target reads the median.
        run kafka "$bin" bench kafka --brokers "$GRFLOW_KAFKA_BROKERS" --runs 3 --json
    else
        log "skipped bench kafka: GRFLOW_KAFKA_BROKERS is not set"
    fi
    # 1M requests from ~500k distinct users: resident memory at 20% vs 100%.
    run memory "$bin" bench memory --json
    # Goodput under a 200 ms p99 SLO on hstu-3l, unbatched vs batched (~7 min).
    run serve "$bin" bench serve --json --out "$OUT/serve"
    # Cluster mode: 2 processes x 1 worker against 1 x 1 and 1 x 2 (~40 s).
    run cluster "$bin" bench cluster --json
    # The allocator on the virtual clock (P99s depend on the committed cost
    # model only; decision times are this machine's).
    for cfg in small emb; do
        run "allocator_$cfg" "$bin" bench allocator --config "configs/allocator-$cfg.toml" \
            --sweep --no-oracle --json-report --out "$OUT/allocator-$cfg"
    done
    # Four bench seeds, two at a time, and their means (~35 min).
    run allocator_tight "$bin" bench allocator --config configs/allocator-tight.toml \
        --sweep --no-oracle --json-report --train-seeds 3 --seeds 42,44,46,48 --jobs 2 \
        --out "$OUT/allocator-tight"
    # Long histories, its own policy; four seeds as well (~43 min).
    run allocator_long "$bin" bench allocator --config configs/allocator-long.toml \
        --sweep --no-oracle --json-report --seeds 42,44,46,48 --jobs 2 \
        --out "$OUT/allocator-long"
fi

log "summary ($OUT)"
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
k = load("kernels")
print(open(os.path.join(out, "machine.txt")).read().strip())
if k:
    for key in sorted(k):
        if not isinstance(k[key], (dict, list)):
            print(f"kernels.{key}: {k[key]}")
gemm = k["gemm_gflops"] if k else None
for i in (1, 2, 3):
    s = load(f"replay_default_{i}")
    if not s:
        continue
    peak = max(n["busy_share_peak"] for n in s["nodes"])
    at60 = f"  (x gemm/60 = {peak * gemm / 60:.2f})" if gemm else ""
    print(f"replay default run {i}: {s['throughput_rps']:.0f} req/s  p50 {s['latency_ms']['p50']:.2f}"
          f"  p99 {s['latency_ms']['p99']:.2f} ms  SLO met {100 * s['slo_satisfaction']:.1f}%"
          f"  emb {s['emb_hit_rate']:.3f}  kv {s['kv_hit_rate']:.3f}"
          f"  busiest node peak busy_share {peak:.2f}{at60}")
for name in ("replay_max", "replay_laru_max"):
    s = load(name)
    if s:
        print(f"{name}: {s['throughput_rps']:.0f} req/s  emb {s['emb_hit_rate']:.3f}  kv {s['kv_hit_rate']:.3f}")
s = load("replay_event")
if s:
    r = s["router"]
    print(f"replay_event: kv_hits {r['kv_hits']}  affinity_wins {r['affinity_wins']}"
          f"  overload_fallbacks {r['overload_fallbacks']}  requests {s['requests_in']}"
          f"  event_time_s {s['event_time_s']:.1f}")
for name, keys in (("memory", ("requests", "distinct_users", "growth_ratio", "rss_at_20_kib", "rss_at_100_kib", "errors")),
                   ("serve", ("goodput_rps_unbatched", "goodput_rps_batched", "goodput_ratio", "efficiency", "gemm_gflops")),
                   ("cluster", ("ratio_2x1_over_1x1", "ratio_2x1_over_1x2", "gemm_gflops", "wall_s"))):
    b = load(name)
    if b:
        print(f"bench {name}: " + "  ".join(f"{k} {b[k]:.3f}" if isinstance(b[k], float) else f"{k} {b[k]}" for k in keys))
# Every allocator bench the run above made (the configs and seeds are listed
# once, in its loops). A row may be missing: no `smart` or `ppo-only` without
# a policy file, no `kv-emb-opt` where no static alpha served the training
# traces whole (kv_emb_opt_missing); it is named, not guessed.
def pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"
for name in sorted(f[:-5] for f in os.listdir(out) if f.startswith("allocator_") and f.endswith(".json")):
    b = load(name)
    # A --seeds run holds one report per seed and their means.
    for r in b.get("per_seed", [b]):
        rows = {(x["regime"], x["policy"]): x for x in r["rows"]}
        for reg in ("steady", "trend", "burst"):
            wanted = ("kv-emb-opt", "static", "ppo-only", "smart")
            p99 = {p: rows[(reg, p)]["p99_ms"] for p in wanted if (reg, p) in rows}
            if not p99:
                continue
            missing = [p for p in wanted if p not in p99]
            smart = rows.get((reg, "smart"))
            under = smart and smart.get("p99_reduction_vs_kv_emb_opt")
            why = r.get("kv_emb_opt_missing", {}).get(reg)
            print(f"bench {name} seed {r['seed']} {reg}: p99 ms "
                  + "  ".join(f"{p} {v:.4f}" for p, v in p99.items())
                  + (f"  smart {pct(under)} under kv-emb-opt" if under is not None else "")
                  + (f"  (no row for {', '.join(missing)})" if missing else "")
                  + (f" (kv-emb-opt: {why})" if why else ""))
    if b.get("mean") and not any(m["policy"] == "smart" for m in b["mean"]):
        print(f"bench {name} means: no smart rows (no policy file?)")
    for m in b.get("mean", []):
        if m["policy"] == "smart":
            below = m.get("seeds_below_static")
            print(f"bench {name} mean over {m['seeds']} seeds {m['regime']}: smart "
                  f"{pct(m.get('p99_reduction_vs_kv_emb_opt_mean'))} under kv-emb-opt "
                  f"({pct(m.get('p99_reduction_vs_kv_emb_opt_min'))} to "
                  f"{pct(m.get('p99_reduction_vs_kv_emb_opt_max'))}), below static on "
                  f"{'-' if below is None else below} of {m.get('seeds_compared_with_static', m['seeds'])}")
EOF
