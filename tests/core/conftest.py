"""Test-only objectives and helpers for the core tests."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.rollout import Sampled


@dataclasses.dataclass(frozen=True)
class Reinforce:
    """Group-baselined REINFORCE with an importance ratio, in plain jnp (a GRPO without clipping).

    A_i = (r_i - mean_group(r)) / (std_group(r) + 1e-6); loss = -token_mean(exp(lp - old_lp) A).
    """

    source = Sampled()
    needs_reference = False
    needs_values = False
    scale_by_std: bool = True

    def prepare(self, batch: Batch) -> Batch:
        rewards = batch.rewards.reshape(-1, batch.group)
        centred = rewards - rewards.mean(axis=1, keepdims=True)
        if self.scale_by_std:
            centred = centred / (rewards.std(axis=1, keepdims=True) + 1e-6)
        return batch.replace(advantages=centred.reshape(-1))

    def loss(self, outputs: PolicyOutputs, batch: Batch):
        batch.require("old_log_probs", "advantages", by="reinforce")
        mask = batch.completion_mask
        lp = outputs.log_probs
        ratio = jnp.exp(lp - jax.lax.stop_gradient(batch.old_log_probs))
        terms = -ratio * batch.advantages[:, None]
        loss = jnp.sum(jnp.where(mask, terms, 0.0)) / jnp.sum(mask)
        return loss, {"ratio": jnp.sum(jnp.where(mask, ratio, 0.0)) / jnp.sum(mask)}

    def loss_weight(self, batch: Batch):
        return jnp.sum(batch.completion_mask).astype(jnp.float32)


@pytest.fixture
def reinforce() -> Reinforce:
    return Reinforce()


# ChatML whose assistant turns are `{% generation %}` blocks, as users write them for TRL's
# `assistant_only_loss`.
MARKED_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def marked_chat_folder(tmp_path) -> Path:
    """The `qwen2-chat` fixture with `MARKED_TEMPLATE` as its chat template."""
    folder = tmp_path / "marked-chat"
    shutil.copytree(Path(__file__).parent / "hf" / "qwen2-chat", folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["chat_template"] = MARKED_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder
