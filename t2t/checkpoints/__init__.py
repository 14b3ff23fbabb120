"""Checkpoints: Orbax save/restore with checksums (`manager`, `integrity`), the model-directory
reader (`model_dir`), the one-writer lock (`lock`), averaging, and HF transformers interop (`hf`).

Submodules are imported explicitly (`from t2t.checkpoints import hf`) so that using one does not
pull in the dependencies of another.
"""
