"""Inputs sharded over 8 devices give the numbers unsharded inputs give.

XLA reads `--xla_force_host_platform_device_count` once, when the backend starts, so the check
runs in a fresh interpreter with the flag set. The script puts every batch-first input of
`every_call.batch()` on a one-axis mesh of 8 CPU devices, `NamedSharding(mesh, P("data"))`, runs
every call of `every_call.CALLS` jitted on the sharded and on the unsharded batch, and compares.
B = 32 over 8 devices leaves 4 rows per device, one whole group of 4: a group never straddles two
devices, as a data-parallel trainer lays them out.
"""

import os
import subprocess
import sys
from pathlib import Path

DEVICES = 8

SCRIPT = """
import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

spec = importlib.util.spec_from_file_location("dew_rl_every_call", sys.argv[1])
every_call = importlib.util.module_from_spec(spec)
spec.loader.exec_module(every_call)

devices = int(sys.argv[2])
assert jax.device_count() == devices, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
by_batch = NamedSharding(mesh, PartitionSpec("data"))

inputs = every_call.as_dtype(every_call.batch(), jnp.float32)
sharded = {key: jax.device_put(value, by_batch) for key, value in inputs.items()}
for key, value in sharded.items():
    assert len(value.sharding.device_set) == devices, key
    assert value.sharding.shard_shape(value.shape)[0] == every_call.B // devices, key
    assert len(inputs[key].sharding.device_set) == 1, key

# One program holding every call: two compilations (sharded, unsharded), not two per call.
run = jax.jit(lambda d: {name: call(d) for name, call in every_call.CALLS.items()})
plain, split = run(inputs), run(sharded)
checked, worst = 0, 0.0
for name in every_call.CALLS:
    for key in plain[name]:
        pairs = zip(jax.tree.leaves(split[name][key]), jax.tree.leaves(plain[name][key]))
        for got, want in pairs:
            got, want = np.asarray(got), np.asarray(want)
            # Reductions across devices add partial sums in another order: a few ulps.
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{name} {key}")
            worst = max(worst, float(np.max(np.abs(got - want), initial=0.0)))
            checked += 1
print("OK", len(every_call.CALLS), "calls", checked, "outputs, largest difference", worst)
"""


def test_sharded_inputs_give_the_numbers_unsharded_inputs_give():
    flags = os.environ.get("XLA_FLAGS", "")
    env = {
        **os.environ,
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip(),
        "JAX_PLATFORMS": "cpu",
    }
    every_call = Path(__file__).with_name("every_call.py")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(every_call), str(DEVICES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.startswith("OK "), result.stdout
    print(result.stdout)
