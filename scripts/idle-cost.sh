#!/usr/bin/env bash
# The CPU an idle `grflow serve` uses (README, Idle cost): starts a job on
# configs/kafka-tansu.toml against a broker, waits until it reads its
# partitions, samples every thread's CPU time from /proc over a window in
# which no request arrives, prints cores per thread and in all, then stops
# the job. Linux only (reads /proc).
#
#   ./scripts/idle-cost.sh [BROKERS] [SECONDS]   # default GRFLOW_KAFKA_BROKERS
#                                                 # or 127.0.0.1:19092, 30 s
#
# Run it on a quiet machine: other load changes what a wake-up costs.
set -euo pipefail
cd "$(dirname "$0")/.."

brokers=${1:-${GRFLOW_KAFKA_BROKERS:-127.0.0.1:19092}}
seconds=${2:-30}
bin=${GRFLOW_BIN:-./target/release/grflow}
[ -x "$bin" ] || cargo build --release --locked >&2

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "machine: ${cpu:-unknown}, $(nproc) cores"

dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
# Topics of its own, so that no earlier traffic is waiting for it.
tag="idle-cost-$$"
sed -e "s/^request_topic = .*/request_topic = \"$tag.requests\"/" \
    -e "s/^response_topic = .*/response_topic = \"$tag.responses\"/" \
    -e "s/^dead_letter_topic = .*/dead_letter_topic = \"$tag.dead-letters\"/" \
    -e "s/^group_id = .*/group_id = \"$tag\"/" \
    configs/kafka-tansu.toml >"$dir/config.toml"
"$bin" serve --config "$dir/config.toml" --brokers "$brokers" \
    >"$dir/summary.json" 2>"$dir/stderr" &
pid=$!
for _ in $(seq 1 120); do
    grep -q "reading worker" "$dir/stderr" && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/stderr" >&2; exit 1; }
    sleep 0.5
done
grep -q "reading worker" "$dir/stderr" || { echo "serve never started reading" >&2; exit 1; }
sleep 3 # past start-up work (restart scan, first commits)

hz=$(getconf CLK_TCK)
snapshot() {
    # "tid name ticks" per thread of the job
    local t f
    for t in /proc/"$pid"/task/*; do
        # After the ")" that ends the name, field 3 (state) comes first:
        # utime and stime (fields 14 and 15) are at 11 and 12.
        read -r -a f < <(sed 's/^.*) //' "$t/stat") || continue
        echo "${t##*/} $(tr ' ' '_' <"$t/comm") $((f[11] + f[12]))"
    done | sort
}
snapshot >"$dir/a"
sleep "$seconds"
snapshot >"$dir/b"
join "$dir/a" "$dir/b" | awk -v s="$seconds" -v hz="$hz" '
    { d = $5 - $3; total += d; if (d > 0) printf "%-16s %.4f cores\n", $2, d / hz / s }
    END { printf "total            %.4f cores over %d s\n", total / hz / s, s }'
kill -TERM "$pid"
wait "$pid" || true
