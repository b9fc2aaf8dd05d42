"""A run assembled from its options: objective, task, prompter with its rewards, and rollouts.

`assemble` is the one place a `TrainConfig` becomes the parts a run is made of, used alike by the
trainer, `dew eval`, a run read back (`dew.inference`) and the command line; `dew.train.config`
holds the options and their checks alone. Each part has its own builder here (`resolve_task`,
`make_prompter`, `make_rollouts`, ...) for a caller that needs one part, and each raises a
one-line `ConfigError` naming the flag of a user's mistake.
"""

import dataclasses
import math
from pathlib import Path
from typing import Any

from dew._user_code import load_named
from dew.objective import Objective, load_objective
from dew.options import ConfigError
from dew.rewards import Reward, parse_reward
from dew.rollout.generate import Rollouts
from dew.rollout.prompter import Prompter
from dew.tasks import Dataset, Task, get_task, load_examples, to_examples
from dew.tokenizers import DIGITS, Tokenizer
from dew.train.config import TrainConfig, validate

__all__ = [
    "RunParts",
    "assemble",
    "load_environment",
    "make_prompter",
    "make_rollouts",
    "resolve_objective_and_task",
    "resolve_task",
    "with_data",
]


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What a run is made of, each part built from its options or given.

    Attributes:
      objective: what the run trains (`dew.objective.Objective`).
      task: where its prompts and reward functions come from.
      prompter: the task's prompts on the model's tokenizer, with the run's rewards and reward
        models.
      rollouts: how prompts become scored rows: one turn, or episodes with their tools and
        environment.

    Examples:
      >>> parts = assemble(TrainConfig(task="sort"))
      >>> parts.prompter.task is parts.task
      True
    """

    objective: Objective
    task: Task
    prompter: Prompter
    rollouts: Rollouts


def assemble(
    config: TrainConfig,
    tokenizer: Tokenizer = DIGITS,
    *,
    objective: Objective | None = None,
    task: Task | None = None,
    rollouts: Rollouts | None = None,
) -> RunParts:
    """The parts of the run `config` describes, its options checked (`validate`) on the way.

    An `objective`, `task` or `rollouts` given is used as it is; the rest is built from the
    options. The options are checked once the objective is known and before the rollouts are
    built, so a mistake costs nothing but its message.

    Examples:
      >>> parts = assemble(TrainConfig(objective="sft", task="sort"))
      >>> parts.objective, parts.task.name, type(parts.rollouts).__name__
      (SFT(), 'sort', 'SingleTurn')
      >>> assemble(TrainConfig().replace(lr=-1.0))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --lr must be > 0, got -1.0
    """
    objective, task = resolve_objective_and_task(config, objective, task)
    prompter = make_prompter(config, task, tokenizer)
    validate(config, objective)
    return RunParts(objective, task, prompter, rollouts or make_rollouts(config))


def resolve_task(config: TrainConfig, task: Task | None = None) -> Task:
    """The task a run uses: `task` when given, else `--data`'s examples, else `--task` by name.

    `--data FILE` makes the task a `Dataset` of the file's examples, named by the file's stem.

    Examples:
      >>> resolve_task(TrainConfig(task="sort")).name
      'sort'
      >>> resolve_task(TrainConfig(task="nope"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: unknown task 'nope'; available: ...
    """
    if task is not None:
        return task
    try:
        if config.data is not None:
            examples = load_examples(config.data)
            return Dataset(examples, name=Path(config.data).stem, **config.task_options)
        return get_task(config.task, **config.task_options)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error)) from error


def with_data(config: TrainConfig, data: Any, task: Task | None) -> tuple[TrainConfig, Task | None]:
    """The config and task of `train(config, data=data, task=task)`.

    A path becomes `--data` (recorded in `config.json`, so a resume finds it again); examples in
    memory (a list of dicts, a `datasets.Dataset`, a pandas DataFrame) become a `Dataset` task
    named `data`.

    Examples:
      >>> config, task = with_data(TrainConfig(), "questions.jsonl", None)
      >>> config.data, task
      ('questions.jsonl', None)
      >>> rows = [{"prompt": f"{a} + 1 = ?", "answer": a + 1} for a in range(10)]
      >>> with_data(TrainConfig(), rows, None)[1].train[0]
      {'prompt': '0 + 1 = ?', 'answer': 1}
    """
    if data is None:
        return config, task
    if task is not None:
        raise ConfigError("train: pass data or task, not both")
    if isinstance(data, str | Path):
        return config.replace(data=str(data)), None
    try:
        return config, Dataset(to_examples(data), **config.task_options)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error)) from error


def resolve_objective_and_task(
    config: TrainConfig, objective=None, task=None
) -> tuple[Objective, Task]:
    """The objective and task a run uses: the instances given, else loaded by name.

    Examples:
      >>> objective, task = resolve_objective_and_task(TrainConfig(objective="sft", task="sort"))
      >>> objective, task.name
      (SFT(), 'sort')
    """
    if objective is None:
        try:
            objective = load_objective(config.objective, config.objective_options)
        except (ValueError, TypeError) as error:
            raise ConfigError(str(error)) from error
    return objective, resolve_task(config, task)


def _reward_options(config: TrainConfig) -> dict[str, dict[str, Any]]:
    """`--reward-option NAME.KEY=VALUE`s grouped by reward name.

    Examples:
      >>> _reward_options(TrainConfig(reward_options={"format.pattern": "ok"}))
      {'format': {'pattern': 'ok'}}
    """
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in config.reward_options.items():
        name, sep, option_name = key.rpartition(".")
        if not sep or not name:
            raise ConfigError(f"--reward-option {key}: expected NAME.KEY=VALUE")
        grouped.setdefault(name, {})[option_name] = value
    return grouped


def _reward_model(spec: str, devices: int | None) -> Reward:
    """The `Reward` of a `--reward-model PATH[=WEIGHT]` value, named by the folder.

    The folder is checked (config, tensors, chat template) and loaded here, before the run
    writes anything; `ConfigError` naming the flag and the path otherwise.

    Examples:
      >>> reward = _reward_model("tests/core/hf/qwen2-reward=0.5", None)
      >>> reward.name, reward.weight
      ('qwen2-reward', 0.5)
      >>> _reward_model("tests/core=x", None)
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --reward-model 'tests/core=x': the weight 'x' is not a number
    """
    from dew import hf  # the checkpoint libraries load only when a reward model does
    from dew.models.reward import TextScorer

    path, sep, weight_text = spec.rpartition("=")
    if not sep:
        path, weight_text = spec, "1"
    try:
        weight = float(weight_text)
    except ValueError:
        raise ConfigError(
            f"--reward-model {spec!r}: the weight {weight_text!r} is not a number"
        ) from None
    if not math.isfinite(weight):
        raise ConfigError(f"--reward-model {spec!r}: the weight must be finite")
    try:
        model, tokenizer = hf.load_reward_model(path), hf.load_tokenizer(path)
        scorer = TextScorer(model, tokenizer, devices)
    except ValueError as error:  # CheckpointError, or a tokenizer without a chat template
        reason = str(error).removeprefix(f"{path}: ")  # the folder named once
        raise ConfigError(f"--reward-model {path}: {reason}") from None
    return Reward(Path(path).name, scorer, weight)


def make_prompter(config: TrainConfig, task: Task, tokenizer: Tokenizer = DIGITS) -> Prompter:
    """The `Prompter` of `task` on `tokenizer` with the run's prompt options and `--reward`s.

    `--tool` and `--environment-tools` need a tokenizer with a chat template: the tools'
    schemas reach the model through it, and the model never sees them without one.

    Examples:
      >>> from dew.tasks import get_task
      >>> config = TrainConfig().replace(max_new_tokens=9)
      >>> make_prompter(config, get_task("reverse")).max_new_tokens
      9
      >>> make_prompter(TrainConfig(rewards=("nope",)), get_task("reverse"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --reward 'nope': unknown reward; available: ...
      >>> make_prompter(TrainConfig(tools=("calculator",)), get_task("reverse"))
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --tool 'calculator': model 'default' has no chat template, ...
    """
    options = _reward_options(config)
    try:
        rewards = None
        if config.rewards:
            rewards = tuple(
                parse_reward(spec, options.pop(spec.partition("=")[0], {}))
                for spec in config.rewards
            )
        if options:
            raise ConfigError(f"--reward-option {next(iter(options))}: no --reward of that name")
        if config.reward_models:
            models = [_reward_model(spec, config.mesh.devices) for spec in config.reward_models]
            rewards = (*(task.rewards if rewards is None else rewards), *models)
        prompting = config.prompting
        prompter = Prompter(
            task,
            tokenizer,
            system_prompt=prompting.system_prompt,
            max_prompt_tokens=prompting.max_prompt_tokens,
            max_new_tokens=prompting.max_new_tokens,
            rewards=rewards,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from error
    shown = f"--tool {config.tools[0]!r}" if config.tools else None
    if config.episodes.environment_tools:
        shown = shown or "--environment-tools"
    if shown and not prompter.chat:
        raise ConfigError(
            f"{shown}: model {config.model!r} has no chat template, which is what shows a "
            "model its tools, so it could never call one; use a chat model (smollm2, or a "
            "checkpoint folder with a chat template)"
        )
    return prompter


def make_rollouts(config: TrainConfig) -> Rollouts:
    """How the run's prompts become rollouts: episodes with `--tool`s or an `--environment`.

    Examples:
      >>> type(make_rollouts(TrainConfig())).__name__
      'SingleTurn'
      >>> make_rollouts(TrainConfig(environment="nowhere:Game"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --environment 'nowhere:Game': cannot import 'nowhere' (...)
    """
    from dew.rollout.generate import SingleTurn

    if not config.tools and config.environment is None:
        return SingleTurn()
    from dew.rollout.episode import EpisodeLimits, Episodes

    environment = None if config.environment is None else load_environment(config.environment)
    tools = []
    if config.tools:
        from dew.tools import load_tool

        for spec in config.tools:
            try:
                tools.append(load_tool(spec))
            except ValueError as error:  # a `ToolError` that names the flag already
                raise ConfigError(str(error)) from error
    caps = config.episodes
    limits = EpisodeLimits(
        max_turns=caps.max_turns,
        max_episode_tokens=caps.max_episode_tokens,
        max_result_tokens=caps.max_result_tokens,
        max_calls=caps.max_calls_per_turn,
        tool_timeout=caps.tool_timeout,
    )
    try:
        return Episodes(
            tools=tools,
            environment=environment,
            limits=limits,
            environment_tools=caps.environment_tools,
            rows_apart=config.asynchronous.max_staleness > 0,
        )
    except ValueError as error:  # a method without a schema
        raise ConfigError(f"--environment {config.environment!r}: {error}") from error


def load_environment(spec: str) -> type:
    """The class `module:Class` names, found as `--reward` and `--tool` find theirs.

    `ConfigError` naming `--environment` when it cannot be imported or is not an environment.

    Examples:
      >>> load_environment("json:dump")
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --environment 'json:dump': json has no class dump with reset and step
    """
    try:
        environment = load_named("--environment", spec)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if not isinstance(environment, type) or not callable(getattr(environment, "step", None)):
        module, _, name = spec.partition(":")
        raise ConfigError(
            f"--environment {spec!r}: {module} has no class {name} with reset and step"
        )
    return environment
