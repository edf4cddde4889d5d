"""cerebro_db turns TensorFlow's oneDNN kernels on when the environment leaves them unset,
and an explicit ``TF_ENABLE_ONEDNN_OPTS`` wins (a fresh process each: TensorFlow reads the
variable once, at its import)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import cerebro_db, tensorflow\n"
         "from tensorflow.python.util import _pywrap_util_port as p\n"
         "from cerebro_db.training import onednn_enabled\n"
         "print(p.IsMklEnabled(), onednn_enabled())")


@pytest.mark.parametrize("setting, expected", [(None, "True"), ("0", "False"), ("1", "True")])
def test_onednn_is_on_unless_the_environment_says_otherwise(setting, expected):
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    # TensorFlow's own flag, and the package's probe of it (the bench records that) agrees
    assert out.stdout.strip().splitlines()[-1] == f"{expected} {expected}"
