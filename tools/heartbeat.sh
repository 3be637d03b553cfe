#!/usr/bin/env bash
# Run a long, quiet command with a line every 10 s, so that whoever waits sees it working:
#
#   tools/heartbeat.sh "LABEL" COMMAND [ARG ...]
#
# prints "LABEL..." first, "LABEL: still working (N s)" every 10 s, and "LABEL: done (N s)" at the end,
# on stderr (so that COMMAND's stdout may be redirected alone); the exit status is COMMAND's.
set -uo pipefail
label=$1
shift
start=$SECONDS
echo "$label..." >&2
( while sleep 10; do echo "  $label: still working ($((SECONDS - start)) s)" >&2; done ) &
ticker=$!
"$@"
status=$?
kill "$ticker" 2>/dev/null
wait "$ticker" 2>/dev/null
if [ "$status" -eq 0 ]; then echo "  $label: done ($((SECONDS - start)) s)" >&2; fi
exit "$status"
