"""cerebro_db.native: the first import of tensorflow runs with RTLD_DEEPBIND, nothing else."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "RTLD_DEEPBIND"), reason="no RTLD_DEEPBIND here")
def test_tensorflow_import_runs_with_deepbind_and_only_it(tmp_path):
    # a stand-in package named tensorflow records the dlopen flags its import ran with
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        "import sys\nFLAGS = sys.getdlopenflags()\n")
    (tmp_path / "other.py").write_text("import sys\nFLAGS = sys.getdlopenflags()\n")
    code = textwrap.dedent(f"""
        import os, sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]
        from cerebro_db import native
        before = sys.getdlopenflags()
        native.install()
        native.install()
        assert sum(isinstance(f, native._DeepBindFinder) for f in sys.meta_path) == 1
        import other, tensorflow
        assert not other.FLAGS & os.RTLD_DEEPBIND
        assert tensorflow.FLAGS & os.RTLD_DEEPBIND, tensorflow.FLAGS
        assert sys.getdlopenflags() == before
        assert not native.installed()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_not_installed_outside_a_backend():
    code = "import cerebro_db; from cerebro_db import native; print(native.installed())"
    r = subprocess.run([sys.executable, "-c", code],
                       capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.stdout.strip() == "False", r.stderr
