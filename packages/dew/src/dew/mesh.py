"""The device mesh and array layouts on it: data-parallel batches, replicated or FSDP params.

Only JAX's own sharding is used (`Mesh`, `NamedSharding`, `jax.device_put`, `jit` shardings): the
compiler inserts the collectives, so the same code runs on one CPU, several GPUs or several
processes joined by `jax.distributed.initialize()` (`dew.distributed`). With several processes the
mesh spans every process's devices, process by process, so each process holds one contiguous block
of a batch's rows (`process_rows`): it scores those, and `assemble` makes the global array of them.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "AXIS",
    "assemble",
    "batch_sharding",
    "gather_rows",
    "make_mesh",
    "param_shardings",
    "process_rows",
    "replicated",
    "to_host",
]

AXIS = "data"


def make_mesh(devices: int | None = None, first: int = 0) -> Mesh:
    """A one-axis mesh named `"data"` over `devices` devices from the `first` on (all when None).

    Examples:
      >>> dict(make_mesh(1).shape)
      {'data': 1}
    """
    available = jax.devices()[first:]
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


def process_rows(sharding: jax.sharding.Sharding | None, rows: int) -> slice:
    """The rows of a `[rows, ...]` array laid out with `sharding` that this process holds.

    All of them with one process or no sharding; with several, this process's contiguous block.

    Examples:
      >>> process_rows(batch_sharding(make_mesh(1)), 8), process_rows(None, 8)
      (slice(0, 8, None), slice(0, 8, None))
    """
    if sharding is None:
        return slice(0, rows)
    held = [index[0] for index in sharding.addressable_devices_indices_map((rows,)).values()]
    return slice(
        min(part.start or 0 for part in held),
        max(rows if part.stop is None else part.stop for part in held),
    )


def assemble(local, sharding: jax.sharding.Sharding | None, rows: int) -> jax.Array:
    """The global `[rows, ...]` array laid out with `sharding`, from this process's rows `local`.

    `local` holds the rows `process_rows(sharding, rows)`; each process passes its own
    (`jax.make_array_from_process_local_data`).

    Examples:
      >>> assemble(np.arange(4.0), batch_sharding(make_mesh(1)), 4)
      Array([0., 1., 2., 3.], dtype=float32)
    """
    local = np.asarray(local)
    local = local.astype(jax.dtypes.canonicalize_dtype(local.dtype))
    if sharding is None:
        return jax.numpy.asarray(local)
    return jax.make_array_from_process_local_data(sharding, local, (rows, *local.shape[1:]))


def gather_rows(tree, sharding: jax.sharding.Sharding | None):
    """`tree`'s NumPy arrays of this process's rows, joined with the other processes' in order.

    The rows are `process_rows(sharding, ...)`; the processes are those of `sharding`'s devices
    (a run's sampler may have processes of its own). Unchanged when this process holds all the
    rows. The bytes travel as they are: a float64 array stays float64, though JAX (without x64)
    holds none.

    Examples:
      >>> gather_rows({"rewards": np.array([0.1, 0.2])}, None)
      {'rewards': array([0.1, 0.2])}
    """
    if sharding is None or sharding.is_fully_addressable:
        return tree
    processes = len({device.process_index for device in sharding.device_set})

    def gather(x):
        x = np.ascontiguousarray(x)
        words = x.reshape(len(x), -1).view(np.uint32)
        spread = jax.make_array_from_process_local_data(
            sharding, words, (processes * len(words), words.shape[1])
        )
        return _host_copy(spread).view(x.dtype).reshape(-1, *x.shape[1:])

    return jax.tree.map(gather, tree)


def _host_copy(x):
    """`x` as a NumPy array; gathered from the processes of its own devices when not all here."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def to_host(tree):
    """`tree`'s arrays as NumPy arrays, each gathered from the processes of its own devices.

    Examples:
      >>> to_host({"x": jax.numpy.arange(3)})
      {'x': array([0, 1, 2], dtype=int32)}
    """
    if jax.process_count() > 1:
        return jax.tree.map(_host_copy, tree)
    return jax.device_get(tree)
