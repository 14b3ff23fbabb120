"""t2t: text-to-text Transformer pretraining in JAX, the system of the T5 paper.

Importing `t2t` registers nothing: seqio tasks and mixtures are registered by the modules under
`t2t.data.tasks`, which the CLI and gin files import explicitly.
"""

__version__ = "0.1.0"
