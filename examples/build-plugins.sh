#!/usr/bin/env bash
# Builds the guest plugins in examples/plugins/ (wasm32-wasip2 components) into
# examples/plugins/target, and installs audit-hook into the sample workspace
# (examples/workspace/plugins/audit-hook/plugin.wasm, git-ignored; its plugin.toml is tracked).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi

cargo build --release --target wasm32-wasip2 \
    --manifest-path examples/plugins/Cargo.toml \
    --target-dir examples/plugins/target

out=examples/plugins/target/wasm32-wasip2/release
mkdir -p examples/workspace/plugins/audit-hook
# The sample workspace's plugin.toml is tracked (the same file): written only if they differ,
# so this script, and README's main command that runs it, leave tracked files alone.
cmp -s examples/plugins/audit-hook/plugin.toml examples/workspace/plugins/audit-hook/plugin.toml ||
    cp examples/plugins/audit-hook/plugin.toml examples/workspace/plugins/audit-hook/plugin.toml
cp "$out/audit_hook.wasm" examples/workspace/plugins/audit-hook/plugin.wasm

echo "built components:"
for name in audit_hook misbehave wrong_world bare_names tool_plugin policy_no_rm_rf policy_misbehave; do
    echo "  $PWD/$out/$name.wasm"
done
echo "installed: $PWD/examples/workspace/plugins/audit-hook/plugin.wasm"
