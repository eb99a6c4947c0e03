#!/usr/bin/env bash
# Builds every fuzz target; for each, replays the inputs in fuzz/regressions/<target>/ (bugs
# found before: each must pass once fixed) and then fuzzes for SECONDS (default 20), starting
# from fuzz/seeds/<target>/.
#
#   bash fuzz/run.sh [SECONDS]
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). FUZZ_TOOLCHAIN overrides
# the toolchain (default +nightly). Seeds are only read: new inputs go to a scratch corpus that
# is thrown away. A crashing input lands in fuzz/artifacts/<target>/ (reproduce with
# `cargo +nightly fuzz run <target> <file>`). Every target runs even if an earlier one crashed;
# the exit status is non-zero if any regression input or any fuzzing run crashed.
set -uo pipefail

secs=${1:-20}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS per target, default 20]" >&2
    exit 2
fi
toolchain=${FUZZ_TOOLCHAIN:-+nightly}
targets=(ndjson_line agents payload_json json_compact bus_publish hooks_json policies_json plugin_toml api_edit simd_differential)

cd "$(dirname "$0")/.." || exit 2
if ! cargo "$toolchain" fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 2
fi

echo "== building ${targets[*]}"
cargo "$toolchain" fuzz build || exit 1

scratch=$(mktemp -d "${TMPDIR:-/tmp}/prx-hooks-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

failed=()
for t in "${targets[@]}"; do
    for input in fuzz/regressions/"$t"/*; do
        [[ -f $input ]] || continue
        if cargo "$toolchain" fuzz run "$t" "$input" >"$scratch/replay.log" 2>&1; then
            echo "== $t: regression $(basename "$input"): ok"
        else
            failed+=("$t:$(basename "$input")")
            echo "== $t: regression $(basename "$input"): FAILED"
            grep -E 'panicked at' -A2 "$scratch/replay.log" | head -6 | cut -c1-400 | sed 's/^/   | /'
        fi
    done
    echo "== $t: fuzzing ${secs}s"
    mkdir -p "$scratch/corpus-$t"
    log="$scratch/$t.log"
    cargo "$toolchain" fuzz run "$t" "$scratch/corpus-$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1
    status=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [[ $status -eq 0 ]]; then
        echo "   ok: ${execs:-?} executions, ${cov:-cov: ?}"
    else
        failed+=("$t")
        mkdir -p "fuzz/artifacts/$t"
        cp "$log" "fuzz/artifacts/$t/run.log"
        echo "   FAILED (exit $status) after ${execs:-?} executions (log: fuzz/artifacts/$t/run.log):"
        grep -E 'panicked at' -A2 "$log" | head -6 | cut -c1-400 | sed 's/^/   | /'
        grep -o 'Test unit written to .*' "$log" | sed 's/^/   | /'
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "== FAILED: ${failed[*]} (new crashing inputs are in fuzz/artifacts/)"
    exit 1
fi
echo "== all ${#targets[@]} targets ran ${secs}s without a crash"
