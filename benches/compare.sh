#!/usr/bin/env bash
# The core's figures of an earlier commit and of the working tree, measured alternately in one
# run, with the ratio per figure (docs/performance.md § Comparing two trees).
#
#   bash benches/compare.sh [--rounds N] [--secs S] [--no-callgrind] BASE [OTHER]
#
# BASE (and OTHER, the working tree by default) is any commit git knows. Each tree is exported
# under target/compare/ (never touching the working tree), built with the same harness
# (benches/compare/harness.rs, public API only) and the tree's own Cargo.lock, and run N times
# (7 by default), BASE and OTHER in turn. Medians per figure and OTHER/BASE are printed as a
# Markdown table. With valgrind on PATH (and without --no-callgrind), callgrind's instruction
# counts per delivered event follow, per thread: a count, not a time, so it holds on a busy
# machine. PRX_COMPARE_CARGO_FLAGS adds cargo flags to both builds (e.g. --no-default-features).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

rounds=7
secs=2
callgrind=1
revs=()
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --secs) secs=$2; shift 2 ;;
    --no-callgrind) callgrind=0; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) revs+=("$1"); shift ;;
  esac
done
if ((${#revs[@]} < 1 || ${#revs[@]} > 2)); then
  echo "compare.sh: give BASE and optionally OTHER (see --help)" >&2
  exit 2
fi

work=$root/target/compare
mkdir -p "$work"

# label, source dir
declare -a labels dirs
prepare() {
  local rev=$1 sha dir
  if [[ $rev == WORKTREE ]]; then
    labels+=("worktree"); dirs+=("$root"); return
  fi
  sha=$(git rev-parse --verify --quiet "$rev^{commit}") || {
    echo "compare.sh: $rev is not a commit git knows" >&2; exit 2
  }
  dir=$work/trees/${sha:0:12}
  if [[ ! -f $dir/Cargo.toml ]]; then
    rm -rf "$dir" && mkdir -p "$dir"
    git archive "$sha" | tar -x -C "$dir"
  fi
  labels+=("${sha:0:7}"); dirs+=("$dir")
}
prepare "${revs[0]}"
prepare "${revs[1]:-WORKTREE}"

# One harness crate per tree, sharing a target dir (the dependencies build once when the locks
# agree). Each binary gets its tree's label in its name.
bins=()
for i in 0 1; do
  label=${labels[i]} src=${dirs[i]}
  crate=$work/harness-$label
  mkdir -p "$crate"
  cat >"$crate/Cargo.toml" <<EOF
[package]
name = "compare-$label"
version = "0.0.0"
edition = "2024"
publish = false

[[bin]]
name = "compare-$label"
path = "$root/benches/compare/harness.rs"

[dependencies]
prx-hooks = { path = "$src" }

[profile.release]
debug = 1

[workspace]
EOF
  cp "$src/Cargo.lock" "$crate/Cargo.lock"
  echo "building $label ($src)" >&2
  # shellcheck disable=SC2086
  (cd "$crate" && CARGO_TARGET_DIR="$work/target" cargo build --release -q ${PRX_COMPARE_CARGO_FLAGS:-})
  bins+=("$work/target/release/compare-$label")
done

results=$work/results.txt
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  for i in 0 1; do
    echo "round $r/$rounds: ${labels[i]}" >&2
    "${bins[i]}" figures "$secs" | sed "s/^/${labels[i]} /" >>"$results"
  done
done

if ((callgrind)) && command -v valgrind >/dev/null; then
  for i in 0 1; do
    for n in 100000 300000; do
      echo "callgrind: ${labels[i]}, $n events" >&2
      out=$work/callgrind-${labels[i]}-$n
      valgrind --tool=callgrind --callgrind-out-file="$out" "${bins[i]}" paced "$n" >/dev/null 2>&1
      callgrind_annotate --inclusive=yes "$out" >"$out.txt" 2>/dev/null
    done
  done
fi

python3 - "$results" "$work" "${labels[0]}" "${labels[1]}" "$callgrind" <<'PY'
import re, statistics, sys
results, work, base, other, callgrind = sys.argv[1:6]
vals = {}
order = []
for line in open(results):
    label, name, value = line.split()
    if name not in order:
        order.append(name)
    vals.setdefault((label, name), []).append(float(value))
lower_is_better = lambda n: n.endswith("_ns")
print(f"| figure | {base} | {other} | {other}/{base} | better |")
print("|---|---|---|---|---|")
for name in order:
    a = statistics.median(vals[(base, name)])
    b = statistics.median(vals[(other, name)])
    ratio = b / a if a else float("nan")
    # Within 2 %: the same, as far as medians of a few runs on a shared machine can tell.
    worse = ratio > 1.02 if lower_is_better(name) else ratio < 0.98
    unit = "lower" if lower_is_better(name) else "higher"
    print(f"| {name} | {a:.3f} | {b:.3f} | {ratio:.3f} | {unit}{' (worse)' if worse else ''} |")
n = len(vals[(base, order[0])])
print(f"\nMedians of {n} alternated runs each.")
if callgrind != "1":
    sys.exit(0)
import os
def counts(label, n):
    path = f"{work}/callgrind-{label}-{n}.txt"
    if not os.path.exists(path):
        return None
    text = open(path).read()
    def find(pattern):
        for line in text.splitlines():
            if re.search(pattern, line):
                return int(line.split()[0].replace(",", ""))
        return 0
    return {
        "total": find(r"PROGRAM TOTALS"),
        "producer": find(r"::produce \["),
        "worker": find(r"Worker::run \["),
        "subscriber": find(r"::subscribe_count \["),
    }
rows = {}
for label in (base, other):
    lo, hi = counts(label, 100000), counts(label, 300000)
    if lo is None or hi is None:
        sys.exit(0)
    rows[label] = {k: (hi[k] - lo[k]) / 200000 for k in hi}
    # A build that inlines `Worker::run` into its thread has no symbol of that name: the
    # worker's share is then what the extra events cost beyond the producer and subscriber
    # (the set-up of both runs cancels out in the difference).
    if hi["worker"] == 0 or lo["worker"] == 0:
        r = rows[label]
        r["worker"] = r["total"] - r["producer"] - r["subscriber"]
print(f"\n| instructions per delivered event (callgrind) | {base} | {other} | {other}/{base} |")
print("|---|---|---|---|")
for k in ("producer", "worker", "subscriber", "total"):
    a, b = rows[base][k], rows[other][k]
    print(f"| {k} | {a:.0f} | {b:.0f} | {b / a if a else float('nan'):.3f} |")
PY
