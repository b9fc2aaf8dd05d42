"""A trained run loaded back: its policy at the latest checkpoint, its task, samples from it.

`export_run` writes a run's policy (LoRA adapters merged) as a Hugging Face folder, its
tokenizer beside the weights. A run folder is also a model wherever one is taken
(`--model runs/x`): `dew.train.restore.resolve_model` reads it.
"""

import dataclasses
import functools
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.models import CausalLM
from dew.models.lora import has_lora
from dew.models.reward import RewardModel
from dew.objective import objective_class
from dew.rollout import Prompter
from dew.rollout.episode import EpisodeError
from dew.rollout.generate import Rollouts, SingleTurn
from dew.tasks import Task
from dew.tokenizers import DigitTokenizer, HFTokenizer, Tokenizer
from dew.train.config import TrainConfig, make_prompter, resolve_task
from dew.train.restore import resolve_model, restored_policy, trained_on
from dew.train.runlog import read_config, recorded_data

__all__ = [
    "Run",
    "agent_reply",
    "chat_reply",
    "export_run",
    "load_run",
    "model_run",
    "sample_run",
]


_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""The tokenizer files `export_run` copies from a checkpoint-folder model."""


@dataclasses.dataclass
class Run:
    """A run folder's policy (split into `graphdef` and `params`), prompter, record and step."""

    graphdef: nnx.GraphDef
    params: Any
    prompter: Prompter
    config: dict[str, Any]
    step: int

    @property
    def task(self) -> Task:
        """The run's task."""
        return self.prompter.task


def _prompter(config: TrainConfig, tokenizer) -> Prompter:
    return make_prompter(config, resolve_task(config), tokenizer)


def load_run(
    run_dir: str | Path, step: int | None = None, config: TrainConfig | None = None
) -> Run:
    """The policy of `run_dir` at checkpoint `step` (default: the newest intact one).

    The task and prompt options are the run's (its `--data` found as `recorded_data` finds it),
    or `config`'s when given.

    `FileNotFoundError` when the folder is not a run, holds no intact checkpoint, or the model
    the run was trained on is gone, `ConfigError` when its `--model` is no longer the base it
    was trained on; a damaged newest checkpoint is passed over with a one-line warning (and
    left where it is) and the one before it is used.

    Examples:
      >>> import shutil, tempfile
      >>> from dew.train import TrainConfig, train
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(steps=1, prompts=2, out=out)
      >>> _ = train(config, quiet=True)
      >>> run = load_run(out)
      >>> run.step, run.task.name, run.config["objective"]
      (1, 'reverse', 'sft')
      >>> shutil.rmtree(out)
    """
    run_dir = Path(run_dir)
    record = read_config(run_dir)
    source = trained_on(run_dir, record)
    if config is None:
        config = TrainConfig.from_record(record).replace(data=recorded_data(run_dir, record))
    prompter = _prompter(config, source.tokenizer())
    graphdef, params, step = restored_policy(run_dir, record, source, step)
    return Run(graphdef, params, prompter, record, step)


def export_run(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    *,
    dtype: str | None = None,
    adapters: bool = False,
) -> int:
    """Write the policy of `run_dir` (at `step`, default the newest) as a Hugging Face folder.

    LoRA adapters are merged into the kernels (`dew.hf.save_policy`), and the tokenizer is
    written beside the weights: a checkpoint-folder model's files are copied, any other's
    (a GGUF file's, the digit vocabulary of a built-in size) are written as `tokenizer.json` and
    `tokenizer_config.json` (special tokens, chat template). `dew.hf.load_policy`, `--model OUT`
    and transformers load the folder. A run whose objective trains a score head (reward
    modeling) is written as a `*ForSequenceClassification` folder instead
    (`dew.hf.save_reward_model`), which `dew.hf.load_reward_model` and transformers'
    `AutoModelForSequenceClassification` read. Only the weights are read: the run's task and
    reward functions need not be importable. The tensors are written in `dtype` (None: the
    policy's own). With `adapters`, a LoRA run's adapters alone are written, as a PEFT adapter
    folder over the run's `--model` (`dew.hf.save_adapters`), the tokenizer beside them;
    `ValueError` for a run without LoRA or one that trains a score head, which the adapter
    folder has no place for. The step exported is returned.

    Examples:
      >>> import shutil, tempfile
      >>> import jax.numpy as jnp
      >>> from dew.hf import load_policy, load_tokenizer
      >>> from dew.train import TrainConfig
      >>> from dew.train.trainer import Trainer
      >>> run_dir, out = tempfile.mkdtemp(), tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(
      ...     steps=1, prompts=2, lora_rank=2, out=run_dir)
      >>> _ = Trainer(config, quiet=True).run()
      >>> export_run(run_dir, out)
      1
      >>> policy, tokens = load_policy(out), jnp.array([[1, 5, 6]])
      >>> run = load_run(run_dir)
      >>> trained = nnx.merge(run.graphdef, run.params)
      >>> bool(jnp.allclose(policy(tokens), trained(tokens), atol=1e-5))
      True
      >>> load_tokenizer(out).decode([1, 5, 6])
      '^01'
      >>> shutil.rmtree(run_dir), shutil.rmtree(out)
      (None, None)
    """
    from dew import hf  # the checkpoint formats' libraries load only when exporting

    run_dir, out = Path(run_dir), Path(out)
    record = read_config(run_dir)
    source = trained_on(run_dir, record)
    graphdef, params, step = restored_policy(run_dir, record, source, step)
    policy = nnx.merge(graphdef, params)
    if adapters:
        if not has_lora(policy):
            raise ValueError(f"{run_dir} was trained without LoRA: it has no adapters to export")
        if _exports_score_head(record):
            raise ValueError(f"{run_dir} trains a score head, which an adapter folder cannot hold")
        hf.save_adapters(policy, out, base_model=record["model"], dtype=dtype)
    elif _exports_score_head(record):
        scorer = RewardModel(policy, policy.value_head)
        pad = source.tokenizer().pad_token_id
        hf.save_reward_model(scorer, out, pad_token_id=pad, dtype=dtype)
    else:
        hf.save_policy(policy, out, dtype=dtype)
    folder = source.path
    if folder is not None and (folder / "tokenizer.json").is_file():
        for name in _TOKENIZER_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
    else:
        _write_tokenizer(source.tokenizer(), out)
    return step


def _exports_score_head(record: dict[str, Any]) -> bool:
    """Whether the run's objective trains its value head as a score head (`export_format`
    `sequence_classification`: reward modeling); False when the objective is not installed."""
    try:
        objective = objective_class(record.get("objective", ""))
    except ValueError:
        return False
    return getattr(objective, "export_format", None) == "sequence_classification"


def _write_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """Write `tokenizer` in `folder` as transformers reads it; returns nothing.

    `tokenizer.json`, `tokenizer_config.json` (its special tokens and chat template) and
    `special_tokens_map.json`.

    The digit vocabulary is written as a word-level tokenizer of one symbol per character, which
    `dew.hf.load_tokenizer` reads back to the same ids.

    Examples:
      >>> import tempfile
      >>> from dew.hf import load_tokenizer
      >>> from dew.tokenizers import DIGITS
      >>> folder = Path(tempfile.mkdtemp())
      >>> _write_tokenizer(DIGITS, folder)
      >>> again = load_tokenizer(folder)
      >>> again.encode("^12>"), again.decode([1, 6, 7, 3, 8, 2]), again.vocab_size
      ([1, 6, 7, 3], '^12>3$', 15)
    """
    if isinstance(tokenizer, HFTokenizer):
        fast, special, template = tokenizer.tokenizer, tokenizer.special, tokenizer.chat_template
    elif isinstance(tokenizer, DigitTokenizer):
        fast, special, template = _digit_tokenizer(tokenizer), _digit_special(tokenizer), None
    else:
        raise ValueError(f"cannot write a {type(tokenizer).__name__} as tokenizer.json")
    fast.save(str(folder / "tokenizer.json"))
    special = {name: text for name, text in special.items() if text is not None}
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    if template is not None:
        settings["chat_template"] = template
    for name, content in (
        ("tokenizer_config.json", settings),
        ("special_tokens_map.json", special),
    ):
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def _digit_tokenizer(digits: DigitTokenizer):
    """The digit vocabulary as a `tokenizers.Tokenizer`: each character one word, joined back."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {symbol: index for index, symbol in enumerate(digits.symbols)}
    fast = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=None))
    fast.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    fast.decoder = decoders.Fuse()
    return fast


def _digit_special(digits: DigitTokenizer) -> dict[str, str | None]:
    """The digit vocabulary's special tokens by their transformers names."""
    return {
        "bos_token": "^" if "^" in digits.symbols else None,
        "eos_token": digits.symbols[digits.eos_token_id],
        "pad_token": digits.symbols[digits.pad_token_id],
    }


def model_run(model: str, config: TrainConfig | None = None, seed: int = 0) -> Run:
    """A `Run` of model `model` as it is, on the task `config` names, at step 0.

    A built-in size is initialised from `seed`; a checkpoint is loaded. `config` gives the task
    (`task`, `data`, `rewards` and their options) and the prompt options.

    `ValueError` naming the model or the task when either is unknown.

    Examples:
      >>> run = model_run("tiny", TrainConfig(task="sort"))
      >>> run.step, run.task.name, run.config
      (0, 'sort', {'model': 'tiny', 'task': 'sort'})
    """
    config = config or TrainConfig()
    source = resolve_model(model)
    prompter = _prompter(config, source.tokenizer())
    graphdef, params = nnx.split(source.policy(seed))
    return Run(graphdef, params, prompter, {"model": model, "task": prompter.task.name}, 0)


def sample_run(
    run: Run, n: int, temperature: float = 0.0, seed: int = 0, rollouts: Rollouts | None = None
) -> list[dict[str, Any]]:
    """`n` held-out prompts with the policy's completions: `prompt`, `completion`, `reward`.

    Greedy at `temperature` 0; the completion is its text up to the stop token. `rollouts` says
    how prompts become scored rollouts (one turn by default); an episode's sample also holds
    its `messages`, the whole conversation.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))  # an untrained policy
      >>> run = Run(graphdef, params, Prompter(get_task("reverse"), DIGITS), config={}, step=0)
      >>> [sample["prompt"] for sample in sample_run(run, 2)]
      ['^316>', '^972>']
    """
    prompter = run.prompter
    examples = prompter.task.heldout(n)
    if temperature > 0:
        examples = prompter.task.examples(np.random.default_rng([seed, 0xD15C]), n)
    sampled = (
        (rollouts or SingleTurn())
        .draw(
            run.graphdef,
            run.params,
            prompter,
            prompter.encode_all(examples),
            1,
            jax.random.key(seed),
            temperature=temperature,
        )
        .scored()
    )
    samples = [
        {"prompt": example["prompt"], "completion": text, "reward": float(reward)}
        for example, text, reward in zip(
            examples, sampled.texts(prompter), sampled.rewards, strict=True
        )
    ]
    for sample, episode in zip(samples, sampled.episodes or (), strict=False):
        sample["messages"] = episode.messages
    return samples


_CHAT_SLOTS = 256
"""`chat_reply` sizes its KV cache in multiples of this many positions, so a conversation's turns
reuse a few compiled programs instead of compiling one per prompt length."""


def chat_reply(
    policy: CausalLM,
    tokenizer: Tokenizer,
    messages: list[dict[str, str]],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    tools: list[dict] | None = None,
) -> Iterator[str]:
    """The assistant's answer to `messages`, as pieces of text in the order they are decoded.

    The messages are rendered with the tokenizer's chat template (generation prompt added, the
    JSON schemas of `tools` shown to the model when given) and the answer decoded until the
    template's end-of-turn token, which is not yielded; special tokens (a `<bos>`) are left out
    of the text, as transformers' chat pipeline decodes a reply. Unlike `dew.sampling.sample`, whose
    decoding loop runs inside one compiled program, each token is drawn by one compiled step
    called from Python, so it can be shown as soon as it is drawn; a piece is yielded once its
    bytes decode whole (a character split over tokens waits for the rest). Token `i` of the
    answer is drawn with the key `sample` gives position `P + i` of a one-row batch
    (`fold_in(fold_in(key, P + i), 0)`), `P` the prompt's length.

    `ValueError` when the prompt plus `max_new_tokens` exceeds the model's context.

    Examples:
      >>> from dew.hf import load_policy, load_tokenizer
      >>> folder = "tests/core/hf/qwen2-chat"
      >>> pieces = chat_reply(load_policy(folder), load_tokenizer(folder),
      ...                     [{"role": "user", "content": "hi"}], jax.random.key(0),
      ...                     max_new_tokens=3)
      >>> isinstance("".join(pieces), str)
      True
    """
    from dew.sampling import choose_tokens, row_keys
    from dew.tokenizers import end_of_turn_id

    rendered = tokenizer.apply_chat_template(messages, True, tools=tools)
    # The template writes its own special tokens; a BOS `encode` adds in front would be a
    # second one (Gemma's), as in `dew.rollout.Prompter.continuation`.
    prompt = tokenizer.encode(rendered)[len(tokenizer.encode("")) :]
    end, context = end_of_turn_id(tokenizer), policy.context_length
    if len(prompt) + max_new_tokens > context:
        raise ValueError(
            f"the conversation ({len(prompt)} tokens) plus --max-new-tokens {max_new_tokens} "
            f"exceeds the model's context of {context} positions"
        )
    slots = min(-(-(len(prompt) + max_new_tokens) // _CHAT_SLOTS) * _CHAT_SLOTS, context)
    graphdef, params = nnx.split(policy)
    width = min(-(-len(prompt) // _CHAT_SLOTS) * _CHAT_SLOTS, slots)
    padded = np.full((1, width), tokenizer.pad_token_id, np.int32)
    padded[0, : len(prompt)] = prompt
    logits, cache = _chat_prefill(graphdef, params, padded, len(prompt) - 1, slots)
    answer, shown = [], ""
    for i in range(max_new_tokens):
        position = len(prompt) + i
        keys = row_keys(key, jnp.array([position]))
        token, _ = choose_tokens(logits[None], keys, temperature, 1.0)
        token = int(token[0])
        if token == end:
            break
        answer.append(token)
        text = tokenizer.decode(answer, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            yield text[len(shown) :]
            shown = text
        if i + 1 < max_new_tokens:
            logits, cache = _chat_decode(graphdef, params, token, position, cache)
    text = tokenizer.decode(answer, skip_special_tokens=True)
    if text != shown:
        yield text[len(shown) :]


def agent_reply(
    policy: CausalLM,
    tokenizer: Tokenizer,
    messages: list[dict],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    tools: Sequence[Callable] = (),
    environment: Any = None,
    max_turns: int = 4,
    tool_timeout: float = 10.0,
) -> Iterator[str | dict]:
    """The assistant's turns answering `messages`, its tool calls run, as pieces and messages.

    Each turn is streamed by `chat_reply` (the tools' schemas shown to the model) and yields
    its text pieces (`str`) as they are decoded, then the turn's assistant message (`dict`, its
    Hermes `tool_calls` parsed by `dew.tools.HermesParser`). A turn with calls is answered by
    the `tool` messages of their results (run by a `dew.tools.ToolRunner`, `tool_timeout`
    seconds each; a failed call is an error message, never an exception); a turn without calls
    is handed to `environment.step` when an environment plays, and its observation (a text is
    a `user` message) follows (a `step` that raises is an `EpisodeError` naming it). Each
    message that follows is yielded too, then the next turn is sampled, until a turn neither
    calls a tool nor gets an observation, or `max_turns` turns.
    The yielded messages, appended to `messages`, are the conversation. Turn `t` draws with
    `fold_in(key, t)`. As `dew.rollout.episode.Episodes` plays an episode, but the
    conversation is rendered again for each turn (a chat's turns are few, its answers streamed).

    Reference: TRL's `GRPOTrainer` tool loop; transformers' chat templates' `tools`.

    Examples:
      >>> from dew.hf import load_policy, load_tokenizer
      >>> def add(a: int, b: int) -> int:
      ...     '''Add two integers.
      ...
      ...     Args:
      ...         a: The first number.
      ...         b: The second number.
      ...     '''
      ...     return a + b
      >>> folder = "tests/core/hf/tool-chat"
      >>> events = list(agent_reply(load_policy(folder), load_tokenizer(folder),
      ...     [{"role": "user", "content": "3 + 4?"}], jax.random.key(0), max_new_tokens=3,
      ...     tools=[add]))
      >>> [event["role"] for event in events if isinstance(event, dict)][:1]
      ['assistant']
    """
    from dew.tools import HermesParser, ToolRunner, tool_messages
    from dew.tools.messages import shows_tools, with_tools_shown

    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns!r}")
    parser, conversation = HermesParser(), list(messages)
    with ToolRunner(tools, timeout=tool_timeout) as runner:
        schemas = runner.schemas or None
        if schemas and not shows_tools(tokenizer, schemas):  # SmolLM2's template drops them
            conversation = with_tools_shown(conversation, schemas)
        for turn in range(max_turns):
            text = ""
            for piece in chat_reply(
                policy,
                tokenizer,
                conversation,
                jax.random.fold_in(key, turn),
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                tools=schemas,
            ):
                text += piece
                yield piece
            parsed = parser.parse(text) if tools else None
            message = parsed.message() if parsed else {"role": "assistant", "content": text}
            if parsed is not None and (parsed.calls or parsed.malformed):
                follow = tool_messages(parsed, runner.run(parsed.calls))
            elif environment is not None:
                follow = _observed(environment, message)
            else:
                follow = []
            for added in (message, *follow):
                conversation.append(added)
                yield added
            if not follow:
                return


def _observed(environment: Any, message: dict) -> list[dict]:
    """The messages `environment.step(message)` observes; `EpisodeError` in one line if it raises.

    Examples:
      >>> class Broken:
      ...     def step(self, message):
      ...         return 1 / 0
      >>> _observed(Broken(), {"role": "assistant", "content": "hi"})
      Traceback (most recent call last):
      ...
      dew.rollout.episode.EpisodeError: Broken.step raised ZeroDivisionError: division by zero
    """
    try:
        observation = environment.step(message)
    except Exception as error:  # the user's class: one line, as a failed episode in training
        text = " ".join(str(error).split())
        where = f"{type(environment).__name__}.step"
        raise EpisodeError(f"{where} raised {type(error).__name__}: {text}") from error
    return [] if observation is None else _observation_messages(observation)


def _observation_messages(observation: str | list[dict]) -> list[dict]:
    """An environment's observation as messages: a text is one `user` message.

    Examples:
      >>> _observation_messages("higher")
      [{'role': 'user', 'content': 'higher'}]
    """
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return list(observation)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _chat_prefill(graphdef: nnx.GraphDef, params, tokens: jax.Array, last: jax.Array, slots: int):
    """The logits `[V]` after a chat prompt (its last position `last`) and the filled cache."""
    model = nnx.merge(graphdef, params)
    hidden, cache = model.prefill(tokens, model.init_cache(1, slots))
    return model.unembed(hidden[0, last]), cache


@functools.partial(jax.jit, static_argnums=0, donate_argnums=4)
def _chat_decode(graphdef: nnx.GraphDef, params, token: jax.Array, position: jax.Array, cache):
    """The logits `[V]` after `token` at `position`, and the cache with it written."""
    model = nnx.merge(graphdef, params)
    tokens, positions = jnp.reshape(token, (1, 1)), jnp.reshape(position, (1,))
    hidden, cache = model.decode(tokens.astype(jnp.int32), positions.astype(jnp.int32), cache)
    return model.unembed(hidden[0, 0]), cache
