#!/bin/sh
# An audit-log hook: appends one line per event to the log file named by its first argument
# (relative to the workspace): when, which event, which agent/session, and the payload, which
# arrives on stdin ("stdin_json": true) and, for small payloads, in $ZERO_HOOK_PAYLOAD too.
set -eu
log="${1:-audit.log}"
payload=$(cat)
printf '%s %s %s/%s #%s %s\n' "$ZERO_HOOK_TIMESTAMP" "$ZERO_HOOK_EVENT" \
    "$ZERO_HOOK_AGENT" "$ZERO_HOOK_SESSION" "$ZERO_HOOK_SEQ" "$payload" >> "$log"
