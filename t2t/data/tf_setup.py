"""Keeps TensorFlow, which only runs the input pipeline, off the accelerators.

TensorFlow grabs most of every visible GPU's memory when it first touches one, starving JAX. The
data path calls `hide_accelerators_from_tensorflow()` before building any dataset, so tf.data
runs on the host CPU only.
"""

from __future__ import annotations

import logging

_done = False


def hide_accelerators_from_tensorflow() -> None:
    """Makes GPUs and TPUs invisible to TensorFlow (idempotent, cheap after the first call)."""
    global _done
    if _done:
        return
    import tensorflow as tf

    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except RuntimeError:
            # NOTE: raised once TF has initialized its devices; then they are already claimed
            # (or were never visible). Say so rather than fail: the data still flows.
            if tf.config.get_visible_devices(kind):
                logging.warning(
                    "TensorFlow initialized %s devices before t2t could hide them; it may hold "
                    "accelerator memory. Build the input pipeline before other TF use.",
                    kind,
                )
        except ValueError:
            pass  # this TF build knows no such device type
    _done = True
