"""Episodes with a scripted policy: tool calls, errors, caps, rows ending apart, the loss mask.

The policy's turns are forced: `continue_state` is replaced by a script that writes each row's
next turn (its text's tokens, then the end of turn) into the sampler state as draws would, so the
episode loop, the tools, the observation tokens, the real `extend_state` and the batch are what
is tested. One test runs the real sampler through an environment's turns.
"""

import dataclasses
import json
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.hf import load_tokenizer
from dew.models.llama import build
from dew.models.outputs import log_probs
from dew.models.registry import SIZES
from dew.rewards import Reward
from dew.rollout import Prompter
from dew.rollout.episode import EpisodeLimits, Episodes
from dew.sampling import extend_state
from dew.tasks.guess import NumberGuess

TOOL_CHAT = Path(__file__).resolve().parent / "hf" / "tool-chat"
SCRIPTED_LOG_PROB = -0.5


class _Tokenizer:
    """The fixture's tokenizer, taking the template's `tools` argument (ignored by its template)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def apply_chat_template(self, messages, add_generation_prompt=False, tools=None):
        return self.inner.apply_chat_template(messages, add_generation_prompt)


@dataclasses.dataclass
class _Task:
    """Prompts in `examples`, one reward that records what it was given."""

    prompts: list
    seen: list = dataclasses.field(default_factory=list)
    name: str = "scripted"
    max_new_tokens: int = 40

    @property
    def rewards(self):
        def judged(prompts, completions, **columns):
            self.seen.append(columns)
            return [float("7" in completion) for completion in completions]

        return (Reward("seven", judged, 1.0),)

    def longest_prompt(self, count):
        return 64


@pytest.fixture(scope="module")
def tokenizer():
    return _Tokenizer(load_tokenizer(TOOL_CHAT))


@pytest.fixture(scope="module")
def policy():
    graphdef, params = nnx.split(build(dataclasses.replace(SIZES["tiny"], vocab_size=512), 0))
    return graphdef, params


def scripted(monkeypatch, prompter, script):
    """Make each row's `k`-th turn the `k`-th text of `script[row]` (then the end of turn)."""
    taken = [0] * len(script)
    end = prompter.stop_id

    def forced(graphdef, params, state, key, *, max_new_tokens, appended=None, **_):
        if appended is not None:  # the context before the turn, fed as the sampler feeds it
            state = extend_state(graphdef, params, state, *map(jnp.asarray, appended))
        tokens, lengths = np.array(state.tokens), np.array(state.lengths)
        completion, behavior = np.array(state.completion_mask), np.array(state.behavior_log_probs)
        limit, done = np.asarray(state.limit), np.asarray(state.done)
        for row, turns in enumerate(script):
            if done[row]:
                continue
            ids = [*prompter.continuation(turns[min(taken[row], len(turns) - 1)]), end]
            taken[row] += 1
            ids = ids[: min(max_new_tokens, limit[row] - lengths[row])]
            at = slice(lengths[row], lengths[row] + len(ids))
            tokens[row, at], completion[row, at], behavior[row, at] = ids, True, SCRIPTED_LOG_PROB
            lengths[row] += len(ids)
        return dataclasses.replace(
            state,
            tokens=jnp.asarray(tokens),
            completion_mask=jnp.asarray(completion),
            behavior_log_probs=jnp.asarray(behavior),
            lengths=jnp.asarray(lengths),
            cached=jnp.asarray(lengths - 1),
            done=jnp.ones_like(state.done),
        )

    monkeypatch.setattr("dew.rollout.episode.continue_state", forced)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def fails(x: int) -> int:
    """Always raises.

    Args:
        x: Anything.
    """
    raise RuntimeError("broken")


def hangs(x: int) -> str:
    """Sleeps past its time limit.

    Args:
        x: Anything.
    """
    time.sleep(2.0)
    return "late"


def long_text(n: int) -> str:
    """A long result.

    Args:
        n: How many words.
    """
    return " ".join(["word"] * n)


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def play(policy, tokenizer, monkeypatch, script, *, tools=(add,), **limits):
    task = _Task([f"question {i}" for i in range(len(script))])
    prompter = Prompter(task, tokenizer, max_new_tokens=160)
    scripted(monkeypatch, prompter, script)
    episodes = Episodes(tools=tools, limits=EpisodeLimits(tool_timeout=0.5, **limits))
    examples = [{"prompt": p, "answer": "7"} for p in task.prompts]
    prompts = prompter.encode_all(examples)
    try:
        drawn = episodes.draw(*policy, prompter, prompts, 1, jax.random.key(0))
    finally:
        episodes.close()
    return drawn.scored(), task, prompter


def test_one_call_then_an_answer(policy, tokenizer, monkeypatch):
    rolled, task, prompter = play(
        policy, tokenizer, monkeypatch, [[call("add", a=3, b=4), "It is 7."]]
    )
    (episode,) = rolled.episodes
    assert (episode.turns, episode.tool_calls, episode.ended) == (2, 1, "answer")
    roles = ["system", "user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in episode.messages] == roles
    assert episode.messages[2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 3, "b": 4},
    }
    assert episode.messages[3]["content"] == "7" and episode.final_text == "It is 7."
    assert rolled.rewards.tolist() == [1.0]
    (columns,) = task.seen
    assert columns["messages"][0] == episode.messages and columns["answer"] == ["7"]
    # The row: prompt, the call, the template's tool turn (context), the answer.
    tokens, sampled = rolled.tokens[0], rolled.completion_mask[0]
    present = rolled.attention_mask[0]
    context = present & ~sampled & ~rolled.prompt_mask[0]
    text = tokenizer.decode(tokens[context].tolist())
    assert text == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert tokenizer.decode(tokens[sampled].tolist()).endswith("It is 7.<|im_end|>")
    assert (rolled.behavior_log_probs[0][sampled] == SCRIPTED_LOG_PROB).all()
    assert (rolled.behavior_log_probs[0][~sampled] == 0).all()
    # The whole row is what the template renders of the conversation.
    rendered = prompter.continuation(tokenizer.apply_chat_template(episode.messages))
    assert tokens[present].tolist() == rendered[: int(present.sum())]
    assert rolled.batch.attention_mask is not None
    assert rolled.metrics["turns"] == 2.0 and rolled.metrics["context_tokens"] == context.sum()


def test_a_template_that_drops_the_tools_gets_them_in_the_system_message(
    policy, tokenizer, monkeypatch
):
    # The tokenizer here drops the tools as SmolLM2's template does: the model would never see them.
    rolled, *_ = play(policy, tokenizer, monkeypatch, [["7"]])
    system = rolled.episodes[0].messages[0]
    assert system["role"] == "system" and '"name": "add"' in system["content"]
    assert "<tool_call>" in system["content"]
    prompt = rolled.tokens[0][rolled.prompt_mask[0]].tolist()
    assert '"name": "add"' in tokenizer.decode(prompt)
    # The fixture's own template shows them: no system message is added.
    rolled, *_ = play(policy, tokenizer.inner, monkeypatch, [["7"]])
    assert [m["role"] for m in rolled.episodes[0].messages] == ["user", "assistant"]


def test_parallel_calls_and_every_kind_of_failure_are_answered(policy, tokenizer, monkeypatch):
    turn = call("add", a=1, b=2) + call("add", a=3, b=4)
    failing = call("fails", x=1) + call("hangs", x=1) + call("nope", x=1) + "<tool_call>{bad"
    failing += "</tool_call>"
    script = [[turn, "3 and 7"], [failing, "sorry"]]
    rolled, *_ = play(policy, tokenizer, monkeypatch, script, tools=(add, fails, hangs))
    first, second = rolled.episodes
    assert [m["content"] for m in first.messages if m["role"] == "tool"] == ["3", "7"]
    assert first.tool_calls == 2 and first.tool_errors == {}
    assert second.tool_errors == {"raised": 1, "timeout": 1, "unknown": 1, "malformed": 1}
    assert second.ended == "answer" and second.turns == 2
    assert rolled.metrics["tool_errors/timeout"] == 1.0 and rolled.metrics["tool_calls"] == 3.0
    assert rolled.metrics["tool_errors/calls"] == 0.0  # every kind, every step: no sparse series
    assert not any(name.startswith("env_errors/") for name in rolled.metrics)  # no environment


def test_calls_past_the_cap_are_refused_and_long_results_cut(policy, tokenizer, monkeypatch):
    malformed = "<tool_call>{" + "a long block that is no JSON " * 4 + "</tool_call>"
    script = [
        [call("add", a=1, b=1) * 3, "done"], [call("long_text", n=200), "done"],
        [malformed, "done"],
    ]  # fmt: skip
    rolled, *_ = play(
        policy, tokenizer, monkeypatch, script, tools=(add, long_text), max_calls=2,
        max_result_tokens=10,
    )  # fmt: skip
    capped, cut, quoted = rolled.episodes
    assert capped.tool_calls == 3 and capped.tool_errors == {"calls": 1}
    assert cut.truncated_results == 1
    result = next(m["content"] for m in cut.messages if m["role"] == "tool")
    assert len(tokenizer.encode(result)) <= 10
    # The error reply quotes the model's block: it is cut at the cap as any result is.
    reply = next(m["content"] for m in quoted.messages if m["role"] == "tool")
    assert reply.startswith("Error: not") and len(tokenizer.encode(reply)) <= 10
    assert quoted.tool_errors == {"malformed": 1} and quoted.truncated_results == 1


def test_rows_end_at_different_turns_and_the_caps_end_the_rest(policy, tokenizer, monkeypatch):
    again = call("add", a=1, b=1)
    script = [["7 at once"], [again, "7 after one"], [again]]  # the last never stops calling
    rolled, *_ = play(policy, tokenizer, monkeypatch, script, max_turns=3)
    assert [e.turns for e in rolled.episodes] == [1, 2, 3]
    assert [e.ended for e in rolled.episodes] == ["answer", "answer", "turns"]
    assert rolled.metrics["episode_caps/turns"] == pytest.approx(1 / 3)  # a share of episodes
    sampled = rolled.completion_mask.sum(1)
    assert sampled[0] < sampled[1] < sampled[2]
    tight, *_ = play(policy, tokenizer, monkeypatch, script, max_episode_tokens=40)
    assert tight.episodes[2].ended == "episode_tokens" and tight.episodes[0].ended == "answer"
    ended = [e.ended for e in tight.episodes]
    assert tight.metrics["episode_caps/episode_tokens"] == ended.count("episode_tokens") / 3
    assert (tight.attention_mask.sum(1) - tight.prompt_mask.sum(1) <= 40).all()
    with pytest.raises(ValueError, match="max_episode_tokens must be at least 1"):
        EpisodeLimits(max_episode_tokens=0)


class _Guess:
    """Says `again` after the first turn, then ends."""

    def reset(self, prompt, **columns):
        self.turns = 0
        return prompt

    def step(self, message):
        self.turns += 1
        return "again" if self.turns == 1 else None

    def reward(self, messages, **kwargs):
        return float(len(messages))


def test_the_real_sampler_plays_an_environment(tokenizer):
    prompter = Prompter(_Task(["a", "b"]), tokenizer, max_new_tokens=12)
    model = build(dataclasses.replace(SIZES["tiny"], vocab_size=512), 0)
    bias = jnp.zeros_like(model.lm_head.kernel[...]).at[:, prompter.stop_id].set(8.0)
    model.lm_head.kernel[...] = model.lm_head.kernel[...] + bias  # turns end within 12 tokens
    graphdef, params = nnx.split(model)
    episodes = Episodes(environment=_Guess, limits=EpisodeLimits(max_turns=3))
    prompts = prompter.encode_all([{"prompt": "a"}, {"prompt": "b"}])
    rolled = episodes.draw(graphdef, params, prompter, prompts, 2, jax.random.key(1)).scored()
    assert [e.turns for e in rolled.episodes] == [2, 2, 2, 2]
    assert rolled.reward_parts["environment"].tolist() == [4.0] * 4  # user, turn, again, turn
    batch = rolled.batch
    recomputed = log_probs(model, batch.tokens, batch.completion_mask)
    np.testing.assert_allclose(batch.behavior_log_probs, recomputed, atol=1e-4)
    context = rolled.attention_mask & ~rolled.completion_mask & ~rolled.prompt_mask
    assert (context.sum(1) > 0).all() and batch.reward_weights == (1.0, 1.0)


class _Faulty:
    """Fails as its prompt says: in `reset`, in `step` (written `step(self, text)`, as if it got
    the turn's text), with an `observation` no template renders, in `reward`; `fine` plays."""

    def reset(self, prompt, **columns):
        if prompt == "reset":
            raise KeyError("secret")
        self.prompt = prompt
        return prompt

    def step(self, text):
        if self.prompt == "step":
            return text.strip()  # the turn is a message dict
        return {"content": "not a list"} if self.prompt == "observation" else None

    def reward(self, messages, **kwargs):
        if self.prompt == "reward":
            raise ZeroDivisionError("division by zero")
        return 1.0


def test_an_environment_that_fails_ends_that_episode_alone(policy, tokenizer, monkeypatch, capsys):
    from dew.rollout.episode import EpisodeError

    def draw(prompts):
        prompter = Prompter(_Task(prompts), tokenizer, max_new_tokens=12)
        scripted(monkeypatch, prompter, [["7"]] * len(prompts))
        encoded = prompter.encode_all([{"prompt": p} for p in prompts])
        episodes = Episodes(environment=_Faulty, limits=EpisodeLimits(max_turns=3))
        try:
            return episodes.draw(*policy, prompter, encoded, 1, jax.random.key(0)).scored()
        finally:
            episodes.close()

    kinds = ["reset", "step", "observation", "reward"]
    rolled = draw(["fine", *kinds])
    fine, *failed = rolled.episodes
    assert (fine.env_error, fine.ended, fine.turns) == ("", "environment", 1)
    assert [e.env_error for e in failed] == kinds
    assert [e.ended for e in failed] == ["error", "error", "error", "environment"]
    assert failed[0].turns == 1  # the row's own prompt, one turn, then the end
    assert failed[1].error == (
        "_Faulty.step raised AttributeError: 'dict' object has no attribute 'strip'"
    )
    assert failed[2].error.startswith("_Faulty.step returned an observation the model cannot read")
    assert rolled.reward_parts["environment"].tolist()[:1] == [1.0]
    assert np.isnan(rolled.reward_parts["environment"][1:]).all()  # a failed episode: no judgement
    assert {f"env_errors/{kind}": 1.0 for kind in kinds}.items() <= rolled.metrics.items()
    assert "dew: warning: _Faulty.step raised AttributeError" in capsys.readouterr().err
    with pytest.raises(EpisodeError, match=r"failed all 2 episodes, the first as _Faulty\.step "):
        draw(["step", "observation"])


class _Gated:
    """The `slow` prompt's environment answers its first turn only once every other episode has
    ended (or after `patience` seconds); the others answer `again` twice, after their prompt's
    `delays` seconds, then end."""

    ended, released, delays, others, patience = 0, None, {}, 0, 60.0

    def reset(self, prompt, **columns):
        self.slow, self.turns, self.delay = prompt == "slow", 0, _Gated.delays.get(prompt, 0.0)
        return prompt

    def step(self, message):
        self.turns += 1
        if self.slow:
            if self.turns == 1:
                _Gated.waited = _Gated.released.wait(_Gated.patience)
            return "again" if self.turns == 1 else None
        time.sleep(self.delay)
        if self.turns < 3:
            return "again"
        _Gated.ended += 1
        if _Gated.ended == _Gated.others:
            _Gated.released.set()
        return None


def gated_draw(tokenizer, prompts, rows_apart, delays=None, patience=60.0):
    """Rows of `prompts` (2 each) playing `_Gated` with the real sampler on the tiny model."""
    _Gated.ended, _Gated.released, _Gated.waited = 0, threading.Event(), None
    _Gated.patience = patience
    _Gated.delays, _Gated.others = delays or {}, 2 * sum(p != "slow" for p in prompts)
    prompter = Prompter(_Task(prompts), tokenizer, max_new_tokens=12)
    model = build(dataclasses.replace(SIZES["tiny"], vocab_size=512), 0)
    bias = jnp.zeros_like(model.lm_head.kernel[...]).at[:, prompter.stop_id].set(8.0)
    model.lm_head.kernel[...] = model.lm_head.kernel[...] + bias  # turns end within 12 tokens
    limits = EpisodeLimits(max_turns=4)
    episodes = Episodes(environment=_Gated, limits=limits, rows_apart=rows_apart)
    encoded = prompter.encode_all([{"prompt": p} for p in prompts])
    try:
        return episodes.draw(*nnx.split(model), prompter, encoded, 2, jax.random.key(1)).scored()
    finally:
        episodes.close()


def test_rows_apart_go_on_while_a_row_waits_for_its_environment(tokenizer):
    rolled = gated_draw(tokenizer, ["slow", "a", "b"], rows_apart=True)
    assert _Gated.waited  # the other rows played their three turns while the slow ones waited
    assert [e.turns for e in rolled.episodes] == [2, 2, 3, 3, 3, 3]
    assert [e.ended for e in rolled.episodes] == ["environment"] * 6
    # Together, every row waits for the slow row's answer: it is never released.
    together = gated_draw(tokenizer, ["slow", "a", "b"], rows_apart=False, patience=1.0)
    assert _Gated.waited is False
    np.testing.assert_array_equal(together.tokens, rolled.tokens)


def test_rows_apart_sample_what_rows_together_sample(tokenizer, monkeypatch):
    """Answers at different times split the turns over calls; each row draws as it would."""
    import dew.rollout.episode

    calls, sampler = [], dew.rollout.episode.continue_state

    def counted(*args, appended=None, **kwargs):
        calls.append(None if appended is None else np.asarray(appended[1]).astype(bool).tolist())
        return sampler(*args, appended=appended, **kwargs)

    monkeypatch.setattr("dew.rollout.episode.continue_state", counted)
    prompts, delays = ["a", "b", "c", "d"], {"c": 0.1, "d": 0.2}
    together = gated_draw(tokenizer, prompts, rows_apart=False, delays=delays)
    assert all(rows is None or all(rows) for rows in calls)
    calls.clear()  # the programs are compiled: a call takes less than an answer's delay
    apart = gated_draw(tokenizer, prompts, rows_apart=True, delays=delays)
    assert any(rows is not None and not all(rows) for rows in calls)  # rows went on apart
    for field in ("tokens", "completion_mask", "attention_mask"):
        np.testing.assert_array_equal(getattr(apart, field), getattr(together, field))
    np.testing.assert_allclose(apart.behavior_log_probs, together.behavior_log_probs, atol=1e-6)
    assert [e.turns for e in apart.episodes] == [3] * 8


def test_a_trainer_trains_on_episodes_of_the_guessing_game(tmp_path, monkeypatch):
    from dew.commands.train import _parse_train
    from dew.train.trainer import Trainer

    config, _ = _parse_train(
        [
            *("--objective", "grpo", "--model", "tiny", "--task", "guess"),
            *("--environment", "dew.tasks.guess:NumberGuess", "--max-turns", "3"),
            *("--max-episode-tokens", "12", "--steps", "2", "--prompts", "2", "--group", "4"),
            *("--eval-every", "2", "--eval-prompts", "2", "--eval-k", "4", "--samples-every", "1"),
            *("--out", str(tmp_path)),
        ]
    )
    trainer = Trainer(config, quiet=True)
    assert isinstance(trainer.rollouts, Episodes) and trainer.rollouts.limits.max_turns == 3
    closed = []
    monkeypatch.setattr(Episodes, "close", lambda self: closed.append(self))
    history = trainer.run()
    assert closed == [trainer.rollouts]  # the trainer made them, so it closes them
    first = history[0]
    assert 1.0 <= first["turns"] <= 3.0 and first["sampled_tokens"] >= first["turns"]
    assert first["context_tokens"] >= 0 and np.isfinite(first["loss"])
    assert {"tool_calls", "tool_s", "episode_caps/turns", "eval/reward"} <= set(history[-1])
    sample = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    assert sample["messages"][0] == {"role": "user", "content": "^>"}
    record = json.loads((tmp_path / "config.json").read_text())
    assert record["environment"] == "dew.tasks.guess:NumberGuess"


class _Wordy(NumberGuess):
    """The guessing game, whose first turn after the first step's 2 x 4 episodes is a word the
    digit tokenizer cannot encode."""

    resets = 0

    def reset(self, **columns):
        _Wordy.resets += 1
        first = super().reset(**columns)
        return "again" if _Wordy.resets > 8 else first


def test_an_environment_that_fails_every_episode_stops_the_run_keeping_the_checkpoint(tmp_path):
    from dew.commands.train import _parse_train
    from dew.train.checkpoint import Checkpoints
    from dew.train.runlog import read_metrics
    from dew.train.trainer import Trainer, TrainingError

    config, _ = _parse_train(
        [
            *("--objective", "grpo", "--model", "tiny", "--task", "guess"),
            *("--environment", "dew.tasks.guess:NumberGuess", "--max-turns", "3"),
            *("--max-episode-tokens", "12", "--steps", "3", "--prompts", "2", "--group", "4"),
            *("--checkpoint-every", "1", "--out", str(tmp_path)),
        ]
    )
    _Wordy.resets = 0
    limits = EpisodeLimits(max_turns=3, max_episode_tokens=12)
    episodes = Episodes(environment=_Wordy, limits=limits)
    try:
        with pytest.raises(
            TrainingError,
            match=r"^step 2: the environment failed all 8 episodes, the first as _Wordy\.reset "
            r"returned an observation the model cannot read: ValueError: cannot encode .*; "
            r"checkpoint of step 1 kept$",
        ):
            Trainer(config, quiet=True, rollouts=episodes).run()
    finally:
        episodes.close()
    assert Checkpoints(tmp_path / "checkpoints").latest_step() == 1
    (row,) = read_metrics(tmp_path)  # step 1's, its zeros logged: every series is whole
    assert row["env_errors/observation"] == 0.0 and row["env_errors/reset"] == 0.0
    assert json.loads((tmp_path / "end.json").read_text())["status"] == "failed"


def test_the_tool_and_environment_flags_are_read_and_checked():
    from dew.commands.train import _parse_train
    from dew.options import ConfigError
    from dew.train.assembly import make_rollouts

    config, _ = _parse_train(["--tool", "a:b", "--tool", "c:d", "--max-calls-per-turn", "2"])
    assert config.tools == ("a:b", "c:d") and config.episodes.max_calls_per_turn == 2
    with pytest.raises(ConfigError, match=r"--environment 'dew\.tasks\.guess:Nope'"):
        make_rollouts(config.replace(tools=(), environment="dew.tasks.guess:Nope"))


def test_a_flag_the_run_would_ignore_is_refused_naming_it():
    from dew.objectives.sft import SFT
    from dew.options import ConfigError
    from dew.tasks import get_task
    from dew.tokenizers import DIGITS
    from dew.train.assembly import make_prompter
    from dew.train.config import TrainConfig, validate

    with pytest.raises(ConfigError, match=r"^--max-turns needs --tool or --environment$"):
        validate(TrainConfig().replace(max_turns=3), SFT(), device_count=1)
    game = TrainConfig(environment="dew.tasks.guess:NumberGuess")
    validate(game.replace(max_turns=3), SFT(), device_count=1)
    with pytest.raises(ConfigError, match=r"^--tool-timeout needs --tool or --environment-tools$"):
        validate(game.replace(tool_timeout=3.0), SFT(), device_count=1)
    # Without a chat template nothing shows the model its tools: it could never call one.
    reverse = get_task("reverse")
    with pytest.raises(ConfigError, match=r"^--tool 'calculator': model 'tiny' has no chat"):
        make_prompter(TrainConfig(model="tiny", tools=("calculator",)), reverse, DIGITS)
    with pytest.raises(ConfigError, match=r"^--environment-tools: model 'tiny' has no chat"):
        make_prompter(game.replace(model="tiny", environment_tools=True), reverse, DIGITS)
    make_prompter(game.replace(model="tiny"), reverse, DIGITS)  # an environment alone plays


class _Vault:
    """A secret per episode, read only through its `peek` method, exposed as a tool."""

    def reset(self, prompt, secret, **columns):
        self.secret, self.peeks = secret, 0
        return prompt

    def step(self, message):
        return None

    def peek(self, slot: int) -> str:
        """Read one slot of the vault.

        Args:
            slot: Which slot.
        """
        self.peeks += 1
        return f"{self.secret}@{slot}"

    def reward(self, messages, **kwargs):
        return float(self.peeks)


def test_an_environments_methods_are_tools_run_by_its_own_instance(policy, tokenizer, monkeypatch):
    task = _Task(["a", "b"])
    prompter = Prompter(task, tokenizer, max_new_tokens=160)
    script = [[call("peek", slot=1), call("peek", slot=2), "done"], ["done at once"]]
    scripted(monkeypatch, prompter, script)
    episodes = Episodes(
        tools=(add,), environment=_Vault, environment_tools=True, limits=EpisodeLimits()
    )
    assert [s["function"]["name"] for s in episodes.schemas] == ["add", "peek"]
    assert "self" not in episodes.schemas[1]["function"]["parameters"]["properties"]
    examples = [{"prompt": "a", "secret": "s0"}, {"prompt": "b", "secret": "s1"}]
    rolled = episodes.draw(*policy, prompter, prompter.encode_all(examples), 1, jax.random.key(0))
    first, second = rolled.scored().episodes
    results = [m["content"] for m in first.messages if m["role"] == "tool"]
    assert results == ["s0@1", "s0@2"] and first.turns == 3 and first.tool_errors == {}
    assert second.tool_calls == 0
    assert rolled.scored().reward_parts["environment"].tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="environment_tools needs an environment"):
        Episodes(environment_tools=True)

    class Untyped(_Vault):
        def open(self, door):
            """Open a door."""

    from dew.rollout.episode import environment_methods

    assert environment_methods(Untyped) == ["peek", "open"]
    with pytest.raises(ValueError, match="tool 'open': argument 'door' has no type hint"):
        Episodes(environment=Untyped, environment_tools=True)


def test_the_environment_tools_flag_reaches_the_episodes():
    from dew.commands.train import _parse_train
    from dew.objectives.sft import SFT
    from dew.options import ConfigError
    from dew.train.assembly import make_rollouts
    from dew.train.config import validate

    game = ["--environment", "dew.tasks.guess:NumberGuess"]
    config, _ = _parse_train(game)
    assert not make_rollouts(config).environment_tools
    config, _ = _parse_train([*game, "--environment-tools"])
    assert config.episodes.environment_tools and make_rollouts(config).environment_tools
    assert not make_rollouts(config).rows_apart  # each turn one call: the run is exact
    with pytest.raises(ConfigError, match="--environment-tools needs --environment"):
        validate(config.replace(environment=None), SFT(), device_count=1)
    ahead, _ = _parse_train([*game, "--max-staleness", "1", "--tis-cap", "2"])
    assert make_rollouts(ahead).rows_apart  # ahead of the learner, rows go on apart


def test_an_episode_run_resumed_mid_way_is_the_straight_run_bit_for_bit(tmp_path):
    from dew.commands.train import _parse_train
    from dew.train.trainer import Trainer

    def trainer(out, steps, *resume):
        argv = [
            *("--objective", "grpo", "--model", "tiny", "--task", "guess"),
            *("--environment", "dew.tasks.guess:NumberGuess", "--max-turns", "3"),
            *("--max-episode-tokens", "12", "--prompts", "2", "--group", "4"),
            *("--steps", str(steps), "--out", str(tmp_path / out), *resume),
        ]
        return Trainer(_parse_train(argv)[0], quiet=True)

    straight = trainer("a", 4)
    straight_rows = straight.run()
    trainer("b", 2).run()
    resumed = trainer("b", 4, "--resume")
    resumed_rows = resumed.run()
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params), strict=True):
        assert np.array_equal(a, b)
    timings = {"time", "rollout_s", "update_s", "steps_per_s", "sampler_tokens_per_s", "tool_s"}
    rows = [
        [{k: v for k, v in r.items() if k not in timings} for r in h]
        for h in (straight_rows, resumed_rows)
    ]
    assert rows[0] == rows[1] and [row["step"] for row in rows[1]] == [1, 2, 3, 4]
    assert {"turns", "episode_caps/turns"} <= set(rows[0][0])  # the rows of episodes
