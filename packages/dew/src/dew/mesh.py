"""The device mesh and array layouts on it: data-parallel batches, replicated or FSDP params.

Only JAX's own sharding is used (`Mesh`, `NamedSharding`, `jax.device_put`, `jit` shardings): the
compiler inserts the collectives, so the same code runs on one CPU, several GPUs or several hosts
started with `jax.distributed.initialize()`.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "AXIS",
    "batch_sharding",
    "make_mesh",
    "param_shardings",
    "replicated",
    "to_host",
]

AXIS = "data"


def make_mesh(devices: int | None = None) -> Mesh:
    """A one-axis mesh named `"data"` over the first `devices` devices (all when None).

    Examples:
      >>> dict(make_mesh(1).shape)
      {'data': 1}
    """
    available = jax.devices()
    count = len(available) if devices is None else devices
    if not 1 <= count <= len(available):
        raise ValueError(f"devices must be in [1, {len(available)}] here, got {count}")
    return Mesh(np.array(available[:count]), (AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Arrays split along their first (batch) axis over `"data"`.

    Examples:
      >>> sharding = batch_sharding(make_mesh(1))
      >>> sharding.spec
      P('data',)
      >>> jax.device_put(np.zeros((4, 3)), sharding).sharding == sharding
      True
    """
    return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    """A full copy on every device.

    Examples:
      >>> sharding = replicated(make_mesh(1))
      >>> sharding.spec, sharding.is_fully_replicated
      (P(), True)
    """
    return NamedSharding(mesh, P())


def _fsdp_spec(shape: tuple[int, ...], size: int) -> P:
    """`P` sharding the largest axis of `shape` divisible by `size` over `"data"` (else replicated).

    Examples:
      >>> _fsdp_spec((16, 64), 8), _fsdp_spec((3,), 8)
      (P(None, 'data'), P())
    """
    if size > 1:
        candidates = [axis for axis, n in enumerate(shape) if n % size == 0]
        if candidates:
            axis = max(candidates, key=lambda a: (shape[a], -a))
            return P(*(AXIS if a == axis else None for a in range(len(shape))))
    return P()


def param_shardings(tree, mesh: Mesh, fsdp: bool = False):
    """A `NamedSharding` per leaf of `tree`: replicated, or FSDP-sharded with `fsdp`.

    Examples:
      >>> tree = {"kernel": np.zeros((16, 64)), "bias": np.zeros(3)}
      >>> shardings = param_shardings(tree, make_mesh(1), fsdp=True)
      >>> {name: sharding.spec for name, sharding in shardings.items()}  # one device: no split
      {'bias': P(), 'kernel': P()}
    """
    size = mesh.shape[AXIS]

    def one(x):
        return NamedSharding(mesh, _fsdp_spec(np.shape(x), size) if fsdp else P())

    return jax.tree.map(one, tree)


def to_host(tree):
    """`tree`'s arrays as NumPy arrays, gathered from every process when there are several.

    Examples:
      >>> to_host({"x": jax.numpy.arange(3)})
      {'x': array([0, 1, 2], dtype=int32)}
    """
    if jax.process_count() > 1:
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)
