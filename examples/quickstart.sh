#!/usr/bin/env bash
# README's main command. Builds the sample WASM plugin (examples/plugins/audit-hook) and
# prx-hooks, makes a workspace with `prx-hooks init` in target/quickstart (git-ignored; made on
# the first run and reused after, so your edits stay — delete it to start over), installs the
# plugin into it, replays the workspace's sample events printing every bus message, and serves
# the HTTP API on 127.0.0.1:7878 until Ctrl-C. It writes no file git tracks.
#
#   bash examples/quickstart.sh [WORKSPACE]        (PRX_QUICKSTART_LISTEN=ADDR to listen elsewhere)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ws="${1:-target/quickstart}"
listen="${PRX_QUICKSTART_LISTEN:-127.0.0.1:7878}"

bash examples/build-plugins.sh
# --locked: the versions Cargo.lock pins, so `cargo install --locked --path . --target-dir target`
# (README) installs this very build instead of compiling everything again.
cargo build --release --locked
bin="${CARGO_TARGET_DIR:-target}/release/prx-hooks"

if [ ! -e "$ws/hooks.json" ]; then
    "$bin" init "$ws"
fi
mkdir -p "$ws/plugins/audit-hook"
cp examples/plugins/audit-hook/plugin.toml "$ws/plugins/audit-hook/plugin.toml"
cp examples/plugins/target/wasm32-wasip2/release/audit_hook.wasm "$ws/plugins/audit-hook/plugin.wasm"

echo "workspace: $ws (token: $ws/.prx-hooks/token; follow it with: $bin tail --workspace $ws --runs)"
exec "$bin" run --workspace "$ws" --events "$ws/events.ndjson" --print --listen "$listen"
