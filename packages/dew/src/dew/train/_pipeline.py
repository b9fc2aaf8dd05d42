"""Rollouts sampled ahead of the learner by older weights (`--max-staleness`, `--rollout-devices`).

A version is the step whose update made the weights (0: the initial ones). With staleness `K`,
step `s` trains on the rollout that version `s - 1 - K` sampled (never older, fresher in a run's
first `K` steps): before the update of step `s` the trainer hands `AheadSampler.queue` the
weights of version `s - 1`, which a sampler thread uses to draw step `s + K`'s rollout while the
learner runs the `K` updates between. The learner waits only when the sampler has fallen `K`
steps behind. Two steps are drawn at once (`DRAWS`): an episode waiting on a slow tool holds
its own step's draw, never the update nor the next step's decoding.

The schedule follows the steps, not the clock: two runs with one seed sample each step from the
same version and train on the same rows. The queue is not checkpointed: a resumed run's first
`K` steps are sampled by the weights it restored, fresher than the straight run's.

With `--rollout-devices N` the sampler has the last `N` devices: each version's trained weights
are copied there (`jax.device_put`, as the peers' weight sync), the frozen ones once, and the
scored batch comes back to the learner's devices. Otherwise it samples on the learner's devices
from a copy of the weights (the update donates the learner's own). With `--sample-dtype
bfloat16` the copy is the cast one: the frozen weights are cast once, the trained ones per version.

In a run of several processes (`dew launch`) the sampler's devices are whole processes', the last
ones: those run `serve` and the others learn. The weights reach the sampler's processes by JAX's
cross-host `jax.device_put`, each version in the order both sides queue it; each scored rollout
goes back through the key-value store of JAX's distributed runtime (`dew.distributed.post`), its
batch on the host, and the learner puts it on its own devices (`RemoteSampler`).
"""

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dew.distributed import collect, post
from dew.mesh import batch_sharding, param_shardings, to_host
from dew.rollout import Prompts, Rollout
from dew.train._precision import cast_compiled

__all__ = [
    "DRAWS",
    "Ahead",
    "AheadSampler",
    "Placement",
    "RemoteSampler",
    "serve",
    "staleness_metrics",
]

DRAWS = 2
"""Rollouts a sampler ahead draws at once: one decodes while another waits on its environments
(a slow tool's reply), so the device keeps sampling. Each holds its own KV cache."""

Draw = Callable[[Any, Prompts, jax.Array, jax.sharding.Sharding], Rollout]
"""`draw(weights, prompts, key, sharding)`: a scored rollout of `prompts` sampled by `weights`."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the sampler runs: the learner's mesh, or a mesh of its own (`--rollout-devices`).

    Attributes:
      learner: the learner's mesh, where each scored batch goes.
      sampler: the sampler's own mesh, or None to sample on the learner's.
      frozen: the weights the optimizer never changes, in `dtype`, on the sampler's mesh.
      dtype: the dtype the sampler's weights are in (`--sample-dtype`).
    """

    learner: Mesh
    sampler: Mesh | None
    frozen: Any
    dtype: str = "float32"

    @classmethod
    def of(cls, learner: Mesh, sampler: Mesh | None, frozen, dtype: str = "float32"):
        """A placement whose frozen weights are put on `sampler` and cast to `dtype`, once."""
        if sampler is not None:
            frozen = jax.device_put(frozen, param_shardings(frozen, sampler))
        if dtype != "float32" and _holds(sampler or learner):
            frozen = cast_compiled(frozen, dtype)
        return cls(learner, sampler, frozen, dtype)

    @property
    def rows(self) -> jax.sharding.Sharding:
        """The sampler's batch layout."""
        return batch_sharding(self.sampler or self.learner)

    @property
    def concurrent(self) -> bool:
        """Whether the sampler may draw several rollouts at once: its devices are one process's.

        Over several processes every process must launch the sampler's programs in one order,
        which draws on threads side by side would not keep.
        """
        return len(_processes(self.sampler or self.learner)) == 1

    @property
    def serves(self) -> bool:
        """Whether this process samples for learner processes (it holds no learner device)."""
        return not _holds(self.learner)

    @property
    def remote(self) -> bool:
        """Whether this process learns from rollouts other processes sample."""
        return self.sampler is not None and not _holds(self.sampler)

    def weights(self, params) -> Any:
        """The policy's whole state for the sampler: a copy of `params` beside `frozen`.

        The copy is a new array either way, which the update's donation of `params` leaves
        alone: on the sampler's devices, cast there to a narrower `dtype`, or on the learner's.
        A learner process whose sampler is another's sends a copy of its own and returns that
        copy: the update would donate `params` while the transfer still reads them, and the
        copy must live until the rollout it samples comes back.
        """
        if self.remote:
            copied = jax.tree.map(lambda x: x.copy(), params)
            jax.device_put(copied, param_shardings(copied, self.sampler))
        elif self.sampler is not None:
            copied = jax.device_put(params, param_shardings(params, self.sampler))
            if self.dtype != "float32":
                copied = cast_compiled(copied, self.dtype)
        elif self.dtype != "float32":
            copied = cast_compiled(params, self.dtype)
        else:
            copied = jax.tree.map(lambda x: x.copy(), params)
        return nnx.to_pure_dict(nnx.merge_state(copied, self.frozen))

    def handed(self, rollout: Rollout) -> Rollout:
        """`rollout` as the learner takes it: its batch on the learner's devices.

        On the host instead when this process holds none of them (it `post`s the rollout).
        """
        if self.sampler is None:
            return rollout
        if self.serves:
            return rollout._replace(batch=to_host(rollout.batch))
        return rollout._replace(batch=jax.device_put(rollout.batch, batch_sharding(self.learner)))


def _holds(mesh: Mesh) -> bool:
    """Whether this process holds any of `mesh`'s devices."""
    return any(device.process_index == jax.process_index() for device in mesh.devices.flat)


class Ahead(NamedTuple):
    """A step's rollout drawn ahead: its prompts, sampling key, the version that sampled it."""

    prompts: Prompts
    key: jax.Array
    version: int
    rollout: Any


class _Queued(NamedTuple):
    prompts: Prompts
    key: jax.Array
    version: int
    rollout: "Future[Rollout]"


class AheadSampler:
    """Steps' rollouts drawn on a sampler thread, up to `staleness` versions ahead of the learner.

    Examples:
      >>> from dew.mesh import make_mesh
      >>> def draw(weights, prompts, key, sharding):  # a stand-in: the weights it got
      ...     return weights
      >>> sampler = AheadSampler(2, draw, Placement.of(make_mesh(1), None, {}))
      >>> sampler.queue(1, 10, 0, {"w": np.zeros(1)}, lambda step: (step, None))
      >>> sorted(sampler.queued)
      [1, 2, 3]
      >>> sampler.take(1).version
      0
      >>> sampler.queue(2, 10, 1, {"w": np.ones(1)}, lambda step: (step, None))
      >>> [(a.prompts, a.version, a.rollout["w"]) for a in map(sampler.take, (2, 3, 4))]
      [(2, 0, array([0.])), (3, 0, array([0.])), (4, 1, array([1.]))]
      >>> sampler.close()
    """

    def __init__(self, staleness: int, draw: Draw, placement: Placement):
        self.staleness = staleness
        self.placement = placement
        self._draw = draw
        self._queued: dict[int, _Queued] = {}
        draws = DRAWS if staleness and placement.concurrent else 1
        self._thread = ThreadPoolExecutor(draws, thread_name_prefix="dew-sampler")

    @property
    def queued(self) -> list[int]:
        """The steps whose rollouts are queued or drawn, not yet taken."""
        return list(self._queued)

    def queue(
        self,
        step: int,
        last: int,
        version: int,
        params,
        prompts_of: Callable[[int], tuple[Prompts, jax.Array]],
    ) -> None:
        """Queue the rollouts of steps `step` to `step + staleness` (to `last`) not queued yet.

        They are sampled by `params`, the trained weights of version `version`;
        `prompts_of(step)` gives a step's prompts and sampling key.
        """
        weights = None
        for ahead in range(step, min(step + self.staleness, last) + 1):
            if ahead in self._queued:
                continue
            if weights is None:
                weights = self.placement.weights(params)
            prompts, key = prompts_of(ahead)
            rollout = self._submit(ahead, weights, prompts, key)
            self._queued[ahead] = _Queued(prompts, key, version, rollout)

    def _submit(self, step: int, weights, prompts: Prompts, key: jax.Array) -> "Future[Rollout]":
        """Step `step`'s rollout, drawn on the sampler thread."""
        return self._thread.submit(self._sample, weights, prompts, key)

    def _sample(self, weights, prompts: Prompts, key: jax.Array) -> Rollout:
        rollout = self._draw(weights, prompts, key, self.placement.rows)
        return self.placement.handed(rollout)

    def take(self, step: int) -> Ahead:
        """Step `step`'s rollout, waited for (a failure in the sampler is raised here)."""
        queued = self._queued.pop(step)
        return Ahead(queued.prompts, queued.key, queued.version, queued.rollout.result())

    def close(self) -> None:
        """Drop what is queued and wait for the rollout being drawn, if any."""
        for queued in self._queued.values():
            queued.rollout.cancel()
        self._queued.clear()
        self._thread.shutdown(wait=True)


class RemoteSampler(AheadSampler):
    """An `AheadSampler` whose rollouts other processes draw (`serve`): what a learner runs.

    Queueing a step sends the weights that sample it when the sampler's processes need them,
    in the order they `serve`; each rollout is collected from the coordinator as it comes.
    """

    def _submit(self, step: int, weights, prompts: Prompts, key: jax.Array) -> "Future[Rollout]":
        return self._thread.submit(self._collect, _posted(step, jax.process_index()), weights)

    def _collect(self, posted: str, sent) -> Rollout:
        """The rollout posted under `posted`, on the learner's devices.

        `sent`, the copy of the weights that samples it, is held until then: the transfer in
        flight may still read it.
        """
        return self.placement.handed(collect(posted))


def serve(sampler: AheadSampler, first: int, last: int, params, prompts_of) -> None:
    """Draw steps `first` to `last`'s rollouts for the learner processes: a sampler process's run.

    `sampler` follows the learner's schedule (`AheadSampler.queue` of each step with the
    version before it), so each version's weights are received (`params`, the learner's
    arrays, which this process holds none of) as the learner sends them. Each rollout, scored
    and gathered on every sampler process alike, is posted by the first of them as soon as it
    is, once for each learner process.
    """
    placement = sampler.placement
    posts = jax.process_index() == min(_processes(placement.sampler))
    for step in range(first, last + 1):
        sampler.queue(step, last, step - 1, params, prompts_of)
        rollout = sampler.take(step).rollout
        for learner in _processes(placement.learner) if posts else ():
            post(_posted(step, learner), rollout)


def _processes(mesh: Mesh) -> list[int]:
    """The processes holding `mesh`'s devices, in order."""
    return sorted({device.process_index for device in mesh.devices.flat})


def _posted(step: int, learner: int) -> str:
    """The key under which step `step`'s rollout waits for learner process `learner`."""
    return f"dew/rollout/{step}/{learner}"


def staleness_metrics(versions: np.ndarray, learner_version: int) -> dict[str, float]:
    """The mean and largest number of versions each row's sampling weights trail the learner's.

    Examples:
      >>> staleness_metrics(np.array([3, 3, 5, 5]), 5)
      {'staleness_mean': 1.0, 'staleness_max': 2.0}
    """
    behind = learner_version - np.asarray(versions)
    return {"staleness_mean": float(behind.mean()), "staleness_max": float(behind.max())}
