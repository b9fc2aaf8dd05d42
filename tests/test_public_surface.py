"""Core's public surface is decided by name: `dew.api`, plus each room's reviewed extras.

A name in a public core module is public exactly when it is in that module's `__all__`; every other
name the module defines starts with `_`. Each `__all__` name is either exported by `dew.api` (the
one entry point) or listed in `ROOM_PUBLIC` below, so adding a public name, or leaving a helper
public, fails here until someone decides it on purpose. The API pages are generated from `__all__`
(docs/hooks/api.py), so this list is also what the docs document.
"""

import ast
import importlib
import re
from pathlib import Path

import pytest

import dew.api

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "packages/dew/src"


def module_name(path: Path) -> str:
    """The import name of a source file under `packages/dew/src`."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Every public core module on disk: a file or package whose dotted name has no `_` component.
CORE = {
    module_name(path): path
    for path in sorted((SRC / "dew").rglob("*.py"))
    if not any(part.startswith("_") for part in module_name(path).split("."))
}

# What each room exports beyond `dew.api`, decided name by name: things a user calls, subclasses
# or configures when using a piece on its own (a model, the sampler, a checkpoint, the mesh), and
# what an objective or task written elsewhere builds on (`dew.objectives.rl` imports `dew.options`
# and `dew.models.outputs`). Return and argument types of public functions are public too.
ROOM_PUBLIC: dict[str, set[str]] = {
    "dew.api": set(),
    "dew.batch": set(),
    "dew.cli": {"main"},
    "dew.commands": {"CommandError"},
    "dew.commands.chat": {"run"},
    "dew.commands.eval": {"run"},
    "dew.commands.export": {"run"},
    "dew.commands.flags": {
        "CommandError", "Parser", "about", "add_compile_cache_flag", "add_config_flags",
        "add_objective_flags", "add_process_flags", "add_task_flags", "as_flag", "process_parser",
        "task_values", "tell",
    },
    "dew.commands.launch": {"run"},
    "dew.commands.plot": {"run"},
    "dew.commands.runs": {"run"},
    "dew.commands.sample": {"run"},
    "dew.commands.train": {"run", "train_parser"},
    "dew.compile_cache": {
        "preload_programs",
        "KEPT", "SIGNATURES",
        "KeptProgram",
        "default_cache_dir",
        "program_identity",
    },
    "dew.programs": {
        "WARN_SHARE", "WATCH_EVERY_S", "ProgramCache", "map_limit", "mappings", "watch_mappings",
    },
    "dew.distributed": {
        "ENVIRONMENT", "HEARTBEAT_S", "ProcessError", "barrier", "Processes", "is_primary", "join",
        "processes_from", "post", "collect", "TRANSFER_ADDRESS",
    },
    "dew.evaluation": set(),
    "dew.hf": {
        "SHARD_BYTES", "CheckpointError", "load_policy", "load_reward_model", "load_tokenizer",
        "save_adapters", "save_policy", "save_reward_model", "with_value_head",
    },
    "dew.inference": {"Run", "agent_reply", "chat_reply"},
    "dew.inference.chat": {"agent_reply", "chat_reply"},
    "dew.inference.export": {"write_tokenizer"},
    "dew.inference.run": {"Run"},
    "dew.mesh": {
        "AXIS", "assemble", "batch_sharding", "gather_rows", "make_mesh", "param_shardings",
        "process_rows", "replicated", "to_host",
    },
    "dew.models": set(),
    "dew.models.attention": {"BLOCK", "attend"},
    "dew.models.gemma": {
        "gemma_config", "gemma_to_hf", "gemma2_config", "gemma2_to_hf", "gemma3_config",
        "gemma3_to_hf",
    },
    "dew.models.llama": {
        "spread_rows",
        "ACTIVATIONS", "ROPE_TYPES", "Attention", "Cache", "DecoderLayer", "MLP", "ModelConfig",
        "Policy", "RMSNorm", "abstract", "build", "count_params", "rope_frequencies", "rotary",
        "soft_cap", "value_head",
    },
    "dew.models.lora": {
        "ATTENTION_MODULES", "LORA_MODULES", "MLP_MODULES", "LoRALinear", "add_lora", "has_lora",
        "adapters_off", "merge_lora", "trainable",
    },
    "dew.models.outputs": {
        "chunked_token_log_probs", "log_probs", "log_probs_and_values", "policy_outputs",
        "token_log_probs",
    },
    "dew.models.mistral": {"mistral_config", "mistral_to_hf"},
    "dew.models.phi3": {"FUSED", "phi3_config", "phi3_to_hf"},
    "dew.models.registry": {"PACKAGED", "SIZES", "ModelSource", "resolve_model"},
    "dew.models.reward": {"RewardModel", "TextScorer"},
    "dew.objective": {"ENTRY_POINT_GROUP", "objective_class"},
    "dew.objectives.sft": {"SFT"},
    "dew.options": {
        "AT_LEAST_ONE", "NON_NEGATIVE", "POSITIVE", "PROBABILITY", "SEED", "Range",
        "check_options", "flag_of", "option",
    },
    "dew.rewards": {
        "ANSWER_TAGS", "ENTRY_POINT_GROUP", "available_rewards", "equivalent", "final_answer",
        "format", "parse_reward", "score_texts",
    },
    "dew.rollout": {"Prompts", "Rollouts", "SingleTurn", "StepRollout"},
    "dew.rollout.generate": {
        "Drawn", "DrawnRollout", "Rollouts", "SingleTurn", "draw_rollout",
        "reward_component_scores", "shared_prefix_of",
    },
    "dew.rollout.episode": {
        "Environment", "Episode", "EpisodeError", "EpisodeLimits", "Episodes",
        "environment_methods", "episode_metrics",
    },
    "dew.rollout.prompter": {"Prompts"},
    "dew.rollout.sources": {"ScoredPairs", "StepRollout"},
    "dew.sampling": {
        "row_keys",
        "choose_tokens",
        "SamplerState", "Samples", "continue_state", "extend_state", "prefill_state",
        "sample_state",
    },
    "dew.tasks.guess": {"Guess", "NumberGuess", "one_digit_turns", "solved"},
    "dew.tasks": {"ENTRY_POINT_GROUP", "Add", "Arithmetic", "Copy", "Reverse", "Sort",
                  "position_credit", "to_examples"},
    "dew.tasks.arithmetic": {"LEVELS", "Arithmetic"},
    "dew.tasks.dataset": {"to_examples"},
    "dew.tasks.digits": {"Add", "Copy", "Reverse", "Sort", "answer_credit", "position_credit"},
    "dew.tokenizers": {
        "DIGITS", "DigitTokenizer", "HFTokenizer", "end_of_turn_id", "with_system_prompt",
    },
    "dew.tools": {
        "ENTRY_POINT_GROUP", "ERROR_KINDS", "HermesParser", "ParsedTurn", "ToolCall",
        "ToolCallParser", "ToolError", "ToolResult", "ToolRunner", "appended_tokens",
        "closing_tokens", "json_schema", "load_tool", "malformed_results", "tool_messages",
        "truncate",
    },
    "dew.tools.builtin": {"calculator"},
    "dew.tools.calls": {"HermesParser", "ParsedTurn", "ToolCall", "ToolCallParser"},
    "dew.tools.messages": {
        "appended_tokens", "closing_tokens", "malformed_results", "shows_tools", "tool_messages",
        "with_tools_shown",
    },
    "dew.tools.runner": {"ERROR_KINDS", "ToolResult", "ToolRunner", "text_ids", "truncate"},
    "dew.tools.schema": {"ENTRY_POINT_GROUP", "ToolError", "json_schema", "load_tool"},
    "dew.train": set(),
    "dew.train.callbacks": {
        "Checkpointing", "MetricsLog", "Progress", "RewardPlot", "SampleLog", "StepRecord",
        "TrainingRun", "ending_status", "step_samples",
    },
    "dew.train.checkpoint": {"Checkpoints"},
    "dew.train.config": {
        "AsyncOptions", "CHECKPOINT_DEFAULTS", "EpisodeOptions", "EvalOptions", "LoRAOptions",
        "MemoryOptions", "MeshOptions",
        "OptimizerOptions", "PrecisionOptions", "PromptOptions", "RolloutOptions", "RunOptions",
        "SECTIONS", "UpdateOptions", "validate",
    },
    "dew.train.assembly": {
        "RunParts", "assemble", "load_environment", "make_prompter", "make_rollouts",
        "resolve_objective_and_task", "resolve_task", "with_data",
    },
    "dew.train.plot": {"PANELS", "plot_run", "plot_runs", "run_labels"},
    "dew.train.restore": {"restored_policy", "trained_on"},
    "dew.train.runlog": {
        "CONFIG", "METRICS", "MetricsFile", "ProgressDisplay", "default_run_dir", "read_config",
        "read_metrics", "recorded_data", "write_config",
    },
    "dew.train.runs": {"END", "RunEnd", "RunSummary", "check_unlocked", "list_runs",
                       "run_options", "summarize_run"},
    "dew.train.trackers": {"STATE", "TRACKERS", "Reporting", "Tracker", "TrackerRun",
                           "reporting_callbacks", "tracker_names"},
    "dew.train.trainer": {"greedy_reward"},
    "dew.train.update": {
        "SWEPT",
        "UpdateSpec",
        "compiled_reference",
        "compiled_update",
        "schedule_steps",
        "update_temperature",
        "learning_rate",
        "make_reference",
        "make_update",
        "optimizer",
    },
}  # fmt: skip


def defined_names(path: Path) -> set[str]:
    """The names a module's own top level binds: functions, classes and assigned constants."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - {"__all__"}


def test_every_public_core_module_is_decided():
    assert set(CORE) == set(ROOM_PUBLIC)


@pytest.mark.parametrize("module", sorted(CORE))
def test_a_name_is_public_only_when_its_module_exports_it(module):
    exported = set(importlib.import_module(module).__all__)
    undecided = {name for name in defined_names(CORE[module]) if not name.startswith("_")}
    assert undecided <= exported, f"{module}: public by name but not in __all__"
    assert not {name for name in exported if name.startswith("_")}, module


@pytest.mark.parametrize("module", sorted(CORE))
def test_every_exported_name_is_in_dew_api_or_reviewed(module):
    imported = importlib.import_module(module)
    beyond_api = {
        name
        for name in imported.__all__
        if getattr(dew.api, name, None) is not getattr(imported, name)
    }
    assert beyond_api == ROOM_PUBLIC[module]


def test_dew_api_exports_what_it_imports_and_nothing_private():
    # `@py_builtins` and the like: pytest's assertion rewriting, when it collected the module
    imported = {name for name in vars(dew.api) if not name.startswith(("_", "@"))}
    assert set(dew.api.__all__) == imported


# Imports of a private core name: `from dew.x import _y`, or a module path with a `_` component.
PRIVATE_IMPORT = re.compile(
    r"from\s+(dew(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n]*)|import\s+(dew(?:\.\w+)*)"
)


def private_imports(text: str) -> list[str]:
    """Each private core name or module `text` imports (dew.rl's own private helpers aside)."""
    found = []
    for match in PRIVATE_IMPORT.finditer(text):
        module = match[1] or match[3]
        if module.startswith(("dew.rl", "dew.objectives.rl")):
            continue
        if any(part.startswith("_") for part in module.split(".")):
            found.append(module)
        names = re.findall(r"\w+", match[2] or "")
        found += [f"{module}.{name}" for name in names if name.startswith("_")]
    return found


USER_FACING = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "packages").glob("*/README.md"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "packages/dew-objectives-rl/src").rglob("*.py"),
    ]
)


@pytest.mark.parametrize("path", USER_FACING, ids=lambda path: str(path.relative_to(ROOT)))
def test_docs_benchmarks_and_other_distributions_use_only_public_names(path):
    assert private_imports(path.read_text()) == []


def test_a_private_import_is_caught():
    text = (
        "from dew.train.update import (\n    UpdateSpec,\n    _outputs_of,\n)\nimport dew._traces\n"
    )
    assert private_imports(text) == ["dew.train.update._outputs_of", "dew._traces"]
