#!/usr/bin/env bash
# Peak memory of `sluice dlq inspect` on a poison queue holding 20 messages of
# 5 MiB (random bodies), for the binary of REV and of the working tree:
#   scripts/inspect-memory.sh 9dab911
# Needs the local RabbitMQ (make services) and /usr/bin/time.
set -euo pipefail
rev=${1:?usage: $0 REV}
dir=$(mktemp -d)
trap 'rm -rf "$dir"; git worktree remove --force "$dir/old" 2>/dev/null || true' EXIT
queue="sluice_inspect_memory_$$"
git worktree add -q "$dir/old" "$rev"
(cd "$dir/old" && go build -o "$dir/sluice-old" ./cmd/sluice)
go build -o "$dir/sluice-new" ./cmd/sluice
python3 - "$dir/archive.jsonl" "$queue.poison" <<'PY'
import base64, json, os, sys
with open(sys.argv[1], "w") as f:
    for i in range(20):
        f.write(json.dumps({"queue": sys.argv[2], "uuid": "u%d" % i,
            "metadata": {"sluice_event_id": "m%d" % i, "sluice_poison_class": "poison"},
            "payload_base64": base64.b64encode(os.urandom(5 << 20)).decode()}) + "\n")
PY
"$dir/sluice-new" --audit "$dir/audit.jsonl" topology apply --queue "$queue" >/dev/null
"$dir/sluice-new" --audit "$dir/audit.jsonl" dlq restore --from "$dir/archive.jsonl" >/dev/null
for b in old new; do
  label=$rev; [ "$b" = new ] && label="working tree"
  for flags in "" "--json"; do
    /usr/bin/time -f "$label: inspect $flags max RSS %M KB" "$dir/sluice-$b" dlq inspect --queue "$queue.poison" $flags >/dev/null
  done
done
for q in $(rabbitmqctl -q list_queues name | grep "^$queue"); do rabbitmqctl -q delete_queue "$q" >/dev/null; done
