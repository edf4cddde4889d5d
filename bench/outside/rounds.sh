#!/bin/bash
# usage: rounds.sh WL NROUNDS "ONEDNN THREADS INPUT SPE VBS"   (Keras' setting for the rounds)
# Rounds alternate which system runs first; each line of $OUTSIDE_OUT is one run (JSON).
wl=$1; n=$2; set -- $3
for r in $(seq 1 "$n"); do
  for sys in $( [ $((r % 2)) -eq 1 ] && echo "keras cerebro" || echo "cerebro keras"); do
    echo "# $(date +%T) $wl round $r $sys load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    if [ "$sys" = keras ]; then
      TF_ENABLE_ONEDNN_OPTS=$1 "$OUTSIDE_PY" "$OUTSIDE_DIR/seq_keras.py" "$wl" "$2" "$3" "$4" "$5" "r$r" 2>/dev/null >> "$OUTSIDE_OUT"
    else
      "$OUTSIDE_PY" "$OUTSIDE_DIR/cerebro_run.py" "$wl" "r$r" >> "$OUTSIDE_OUT"
    fi
  done
done
