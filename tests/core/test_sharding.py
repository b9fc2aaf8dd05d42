"""Data parallelism and FSDP on 8 simulated CPU devices give the single-device step."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import importlib.util, json, sys
import jax, numpy as np
spec = importlib.util.spec_from_file_location("core_conftest", sys.argv[1])
conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conftest)
from dew.train import TrainConfig
from dew.train.trainer import Trainer

assert len(jax.devices()) == 8, jax.devices()
runs = {}
for name, devices, fsdp, rank in [
    ("one", 1, False, 0), ("data", 8, False, 0), ("fsdp", 8, True, 0),
    ("lora-one", 1, False, 2), ("lora-fsdp", 8, True, 2),
]:
    config = TrainConfig(model="tiny").replace(
        prompts=8, group=4, steps=1, lr=1e-2, devices=devices, fsdp=fsdp, micro_batches=2,
        lora_rank=rank, out=f"{sys.argv[2]}/{name}")
    trainer = Trainer(config, objective=conftest.Reinforce(), quiet=True)
    history = trainer.run()
    leaves = jax.tree.leaves(trainer.policy_params())
    runs[name] = {
        "loss": history[0]["loss"],
        "reward": history[0]["reward"],
        "params": [np.asarray(x).ravel().tolist() for x in leaves],
        "specs": sorted({str(x.sharding.spec) for x in leaves}),
        "devices": sorted({len(x.sharding.device_set) for x in leaves}),
    }
print(json.dumps(runs))
"""


def test_one_step_on_eight_devices_matches_one_device(tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    conftest = Path(__file__).with_name("conftest.py")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(conftest), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    for name, one in (
        ("data", runs["one"]),
        ("fsdp", runs["one"]),
        ("lora-fsdp", runs["lora-one"]),
    ):
        run = runs[name]
        assert run["reward"] == one["reward"], name  # the same samples
        assert abs(run["loss"] - one["loss"]) < 1e-5, name
        for a, b in zip(run["params"], one["params"], strict=True):
            # Adam's first step is lr * g / (|g| + eps): where a gradient is near eps, the
            # order of eight devices' sums moves it by up to 1.13e-5 (lr 1e-2, an AVX-512 Xeon).
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-5, name
        assert run["devices"] == [8]
    assert runs["data"]["specs"] == ["P()"]
    assert any("'data'" in spec for spec in runs["fsdp"]["specs"])
