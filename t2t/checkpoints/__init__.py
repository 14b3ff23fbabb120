"""Checkpoints: HF transformers interop (`t2t.checkpoints.hf`); Orbax save/restore lives beside it.

Submodules are imported explicitly (`from t2t.checkpoints import hf`) so that using one does not
pull in the dependencies of another.
"""
