#!/bin/bash
# The outside harness (README.md here): load Fashion-MNIST, pack it, run sequential Keras at
# each setting, then rounds of Keras at its best against cerebro_db cold + warm fits (as a
# plain role, fit arguments at their defaults but validation every epoch), and summarize.
# Usage (from the repository, after `make start`): bash bench/outside/run.sh [ROUNDS]
set -euo pipefail
export OUTSIDE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$OUTSIDE_DIR/../.." && pwd)
export OUTSIDE_PY=${OUTSIDE_PY:-$ROOT/.venv/bin/python}
export OUTSIDE_DB=${OUTSIDE_DB:-cerebro_outside}
export OUTSIDE_OUT=${OUTSIDE_OUT:-$ROOT/bench/results/outside.jsonl}
ROUNDS=${1:-3}
eval "$("$ROOT/scripts/cerebro.sh" env | sed 's/^/export /')"
CEREBRO_DB=$OUTSIDE_DB "$ROOT/scripts/cerebro.sh" createdb "$OUTSIDE_DB"
P() { psql -X -q -v ON_ERROR_STOP=1 -d "$OUTSIDE_DB" "$@"; }
"$OUTSIDE_PY" "$OUTSIDE_DIR/load_db.py"
P -f "$OUTSIDE_DIR/pack.sql"
P -f "$OUTSIDE_DIR/setup_models.sql" > /dev/null
# a plain role (a superuser keeps no worker sessions between fits by default)
P <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cerebro_outside') THEN
    CREATE ROLE cerebro_outside LOGIN;
  END IF;
END \$\$;
GRANT CREATE, USAGE ON SCHEMA public TO cerebro_outside;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO cerebro_outside;
SQL
: > "$OUTSIDE_OUT"
# sequential Keras: oneDNN, threads, input, steps_per_execution (0: a pass), validation batch
SETTINGS=("1 2 numpy 0 1024" "1 1 numpy 0 1024" "0 2 numpy 0 1024" "0 1 numpy 0 1024" "1 2 tfdata 0 1024")
for wl in A B C; do
  for s in "${SETTINGS[@]}"; do set -- $s
    echo "# $(date +%T) sweep $wl: $s" >&2
    TF_ENABLE_ONEDNN_OPTS=$1 "$OUTSIDE_PY" "$OUTSIDE_DIR/seq_keras.py" "$wl" "$2" "$3" "$4" "$5" sweep 2>/dev/null >> "$OUTSIDE_OUT"
  done
  best=$("$OUTSIDE_PY" - "$wl" <<PY
import json, os, sys
runs = [json.loads(line) for line in open(os.environ["OUTSIDE_OUT"])]
runs = [r for r in runs if r["system"] == "keras" and r["wl"] == sys.argv[1] and r["tag"] == "sweep"]
b = min(runs, key=lambda r: r["total_s"])
print(b["onednn"], b["threads"], b["input"], b["spe"], b["vbs"])
PY
)
  bash "$OUTSIDE_DIR/rounds.sh" "$wl" "$ROUNDS" "$best"
done
"$OUTSIDE_PY" "$OUTSIDE_DIR/summarize.py"
