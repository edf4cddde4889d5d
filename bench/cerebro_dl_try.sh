#!/usr/bin/env bash
# Try Cerebro's own implementation (PyPI cerebro-dl, Spark backend, local Spark) in a
# throwaway virtual environment under /tmp (never the project's .venv). Not run by
# `make bench`: its outcome on this machine is recorded in bench/results/cerebro_dl.md.
#   bash bench/cerebro_dl_try.sh [venv-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-/tmp/cerebro_dl_venv}
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q cerebro-dl
# cerebro-dl does not declare these; petastorm 0.13 needs pyarrow < 15 (pyarrow.filesystem),
# which needs numpy < 2; tensorboard is imported by cerebro.tune.
"$VENV/bin/python" -m pip install -q "pyarrow<15" "numpy<2" "pandas<3" tensorboard \
    "tensorflow-cpu==${CEREBRO_DL_TF:-2.15.1}"
java -version
export PYSPARK_PYTHON="$VENV/bin/python" PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
"$VENV/bin/python" "$ROOT/bench/cerebro_dl_try.py" "${CEREBRO_FASHION_DIR:-/usr/share/datasets/fashion-mnist}"
