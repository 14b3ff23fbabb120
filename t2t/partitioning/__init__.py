"""Where every array of a training run lives: the device mesh, the logical-axis rules, shardings.

The network names each parameter dimension with a logical axis (`t2t.nn.axes`: `embed`, `mlp`,
`joined_kv`, ...) and constrains key activations the same way. This package owns the other half:
a 2-D device mesh with axes `data` and `model` (`mesh`), one rules table per sharding mode that
maps logical names to mesh axes (`rules`), and the `Partitioner` that derives a
`jax.sharding.NamedSharding` for every parameter, optimizer statistic and input batch
(`partitioner`). A model is sharded differently by changing a flag, never the network code.

Everything is laid out sharded from the start: the model is traced abstractly (`nnx.eval_shape`),
its shardings are computed from the annotations, and a jitted initializer writes each shard
directly on its device (`out_shardings`), so no device ever holds the whole model unless the rules
replicate it. The optimizer state is created the same way.

Typical use (one process, or one per host)::

    partitioning.initialize_distributed()            # no-op for one process
    partitioner = partitioning.make_partitioner(data=-1, model=2, mode="fsdp")
    model = partitioner.init_model(lambda: nn.build(config, nnx.Rngs(params=0)))
    graphdef, params = nnx.split(model, nnx.Param)
    opt_state = partitioner.init_optimizer(tx, params)
    shard_info = partitioner.data_shard_info()       # this host's seqio.ShardInfo
    batch = partitioner.make_global_batch(local_numpy_batch)
    with partitioner.context():                      # mesh + rules for activation constraints
        params, opt_state, metrics = train_step(params, opt_state, batch)
"""

from t2t.partitioning.mesh import (
    data_shard_of_process,
    initialize_distributed,
    make_mesh,
    resolve_mesh_shape,
)
from t2t.partitioning.partitioner import Partitioner, make_partitioner
from t2t.partitioning.rules import (
    DATA,
    MESH_AXES,
    MODEL,
    RULES,
    LogicalRules,
    logical_axis_rules,
)
from t2t.pytrees import is_variable, param_path

__all__ = [
    "is_variable",
    "DATA",
    "MESH_AXES",
    "MODEL",
    "RULES",
    "LogicalRules",
    "Partitioner",
    "data_shard_of_process",
    "initialize_distributed",
    "logical_axis_rules",
    "make_mesh",
    "make_partitioner",
    "param_path",
    "resolve_mesh_shape",
]
