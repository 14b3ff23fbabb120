"""Test-session set-up shared by every test module.

Eight host CPU devices are requested before JAX initializes, so sharding tests can build real
meshes (2x4, 8x1) on a machine without accelerators. Tests that do not shard run on device 0.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICE_FLAG).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
