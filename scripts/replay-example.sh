#!/usr/bin/env bash
# Replay example against the embedded default. Start the server first, from the repo root:
#   cargo run --release -- serve
# then, in another terminal, from the same directory:
#   scripts/replay-example.sh
# It writes a replay file with three deliveries for the `demo` source, replays it twice (the
# second time is all duplicates), then exports what the server holds and replays that (all
# duplicates again, no balance moves). Each run uses its own event ids, order ids and customer,
# so it works again on the same database with the same output. Needs curl and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${WEBHOOK_INBOX_BIN:-./target/release/webhook-inbox}
[ -x "$bin" ] || cargo build --release
# The server's address: WEBHOOK_INBOX_URL, else WEBHOOK_INBOX_LISTEN (as `serve` read it),
# else the default. The CLI commands below read the same variables.
url=${WEBHOOK_INBOX_URL:-http://${WEBHOOK_INBOX_LISTEN:-127.0.0.1:8080}}
export WEBHOOK_INBOX_URL="$url"
token=${WEBHOOK_INBOX_ADMIN_TOKEN:-$(cat data/admin-token 2>/dev/null || true)}
if ! curl -s -o /dev/null "$url/healthz"; then
    echo "replay-example: no webhook-inbox answers at $url. Start it first, from this" \
        "directory (cargo run --release -- serve), or set WEBHOOK_INBOX_URL (or" \
        "WEBHOOK_INBOX_LISTEN) to where it listens." >&2
    exit 1
fi
if [ -z "$token" ]; then
    echo "replay-example: no admin token: set WEBHOOK_INBOX_ADMIN_TOKEN, or run from the" \
        "directory whose data/admin-token the server made." >&2
    exit 1
fi

run=$(date +%s)-$$
customer="replay-c-$run"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in 1 2 3; do
    body="{\"type\":\"order.completed\",\"data\":{\"order_id\":\"replay-o-$run-$i\",\"customer_id\":\"$customer\",\"points\":$i}}"
    # The body goes in as a JSON string: exactly the bytes that will be signed and sent.
    python3 -c 'import json,sys; print(json.dumps({"source":"demo","event_id":sys.argv[1],"type":"order.completed","body":sys.argv[2]}))' \
        "replay-evt-$run-$i" "$body"
done > "$work/deliveries.jsonl"

echo "== first replay: expect 3 queued"
"$bin" replay "$work/deliveries.jsonl"
echo "== second replay: expect 3 duplicate"
"$bin" replay "$work/deliveries.jsonl"
echo "== export the demo source, replay it: all duplicates"
"$bin" events export --source demo --output "$work/export.jsonl"
"$bin" replay "$work/export.jsonl"
echo "== balance of $customer (1 + 2 + 3 once the consumers ran):"
# The consumers run in the background: wait for the balance, at most 10 s.
for _ in $(seq 50); do
    answer=$(curl -s -H "Authorization: Bearer $token" "$url/loyalty/$customer" || true)
    case "$answer" in *'"balance":6,'*) break ;; esac
    sleep 0.2
done
echo "$answer"
