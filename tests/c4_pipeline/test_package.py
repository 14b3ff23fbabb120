"""The pipeline package stays light: Beam workers need neither JAX, Flax, TensorFlow nor t2t."""

import os
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_importing_the_pipeline_loads_no_model_or_tensorflow_code():
    script = (
        "import sys, c4_pipeline, c4_pipeline.__main__\n"
        "heavy = sorted(m for m in ('jax', 'flax', 't2t', 'tensorflow', 'seqio') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=_ROOT
    ).stdout
    assert out.strip().splitlines()[-1:] in ([], [""])
