"""An episode rollout on 2 simulated CPU devices gives the 1-device rows, tool calls included."""

import json
import os
import subprocess
import sys

import numpy as np

SCRIPT = r"""
import json
import jax, numpy as np
from flax import nnx
import dew.rollout.episode as episode
from dew.mesh import batch_sharding, make_mesh, replicated
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.rewards import Reward
from dew.rollout import Prompter
from dew.tokenizers import DIGITS
from dew.tools import ParsedTurn, ToolCall


def double(n: str) -> str:
    '''Twice a digit.

    Args:
        n: A digit.
    '''
    return str(2 * int(n))


class DigitCalls:
    '''A turn that starts with a digit calls `double` on it; any other turn is the answer.'''

    def parse(self, text):
        if text[:1].isdigit():
            return ParsedTurn("", (ToolCall("double", {"n": text[0]}),), ())
        return ParsedTurn(text, (), ())


def sevens(prompts, completions, **columns):
    return [float("7" in text) for text in completions]


class Task:
    name, max_new_tokens, rewards = "double", 6, (Reward("sevens", sevens, 1.0),)

    def longest_prompt(self, count):
        return count({"prompt": "^9999>"})


assert len(jax.devices()) == 2, jax.devices()
prompter = Prompter(Task(), DIGITS)
model = build(SIZES["tiny"], 0)
# Turns end sooner (some within their 6 tokens), so that some rows call the tool and go on.
model.lm_head.kernel[...] = model.lm_head.kernel[...].at[:, prompter.stop_id].add(3.0)
graphdef, params = nnx.split(model)
prompts = prompter.encode_all([{"prompt": p} for p in ("^12>", "^345>")])
continued, spread = episode.continue_state, []


def spied(graphdef, params, state, key, **settings):
    sharding = state.tokens.sharding
    spread.append((len(sharding.device_set), sharding.is_fully_replicated))
    return continued(graphdef, params, state, key, **settings)


episode.continue_state = spied
runs = {}
for devices in (1, 2):
    mesh, spread[:] = make_mesh(devices), []
    limits = episode.EpisodeLimits(max_turns=3, max_episode_tokens=24)
    episodes = episode.Episodes(tools=[double], parser=DigitCalls(), limits=limits)
    placed = jax.device_put(params, replicated(mesh))
    drawn = episodes.draw(
        graphdef, placed, prompter, prompts, 4, jax.random.key(0), sharding=batch_sharding(mesh)
    )
    rolled = drawn.scored()
    episodes.close()
    batch = rolled.batch
    runs[devices] = {
        **{
            name: np.asarray(getattr(batch, name)).tolist()
            for name in (
                "tokens", "prompt_mask", "completion_mask", "attention_mask", "rewards",
                "behavior_log_probs",
            )
        },
        "turns": [e.turns for e in rolled.episodes],
        "tool_calls": [e.tool_calls for e in rolled.episodes],
        "batch_devices": len(batch.tokens.sharding.device_set),
        "sampled_on": sorted(set(spread)),
    }
print(json.dumps(runs))
"""


def test_an_episode_rollout_on_two_devices_matches_one_device():
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    one, two = runs["1"], runs["2"]
    assert sum(one["tool_calls"]) >= 1 and max(one["turns"]) >= 2  # a call, then a turn after it
    for name in ("tokens", "prompt_mask", "completion_mask", "attention_mask", "rewards"):
        assert two[name] == one[name], name
    assert (two["turns"], two["tool_calls"]) == (one["turns"], one["tool_calls"])
    np.testing.assert_allclose(two["behavior_log_probs"], one["behavior_log_probs"], atol=1e-5)
    assert (one["batch_devices"], one["sampled_on"]) == (1, [[1, True]])
    assert (two["batch_devices"], two["sampled_on"]) == (2, [[2, False]])  # rows split, not copied
