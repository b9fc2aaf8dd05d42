"""The run's options: nested sections, options set by flag name, every range checked first."""

import dataclasses
import json
import math

import pytest

from dew.objectives.sft import SFT
from dew.options import ConfigError, Range
from dew.train.config import SECTIONS, TrainConfig, _option_section, validate


def test_options_are_set_by_their_flag_names_in_whichever_section_holds_them():
    config = TrainConfig().replace(steps=9, top_p=0.5, lr=0.1, micro_batches=2, fsdp=True)
    assert (config.run.steps, config.rollout.top_p, config.optimizer.lr) == (9, 0.5, 0.1)
    assert (config.update.micro_batches, config.mesh.fsdp) == (2, True)
    assert TrainConfig().run.steps == 250  # the default is untouched: the config is frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.objective = "sft"


def test_every_option_name_is_unique_across_sections():
    names = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    top = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS]
    assert len(names + top) == len(set(names + top))
    assert all(_option_section(name) is not None for name in names)


def test_a_record_round_trips_through_json():
    config = TrainConfig(objective="sft", task_options={"max_len": 4}).replace(steps=3, seed=7)
    record = json.loads(json.dumps(dataclasses.asdict(config)))
    assert TrainConfig.from_record({**record, "model_config": {"hidden_size": 1}}) == config


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("lr", math.nan, "--lr must be > 0, got nan"),
        ("lr", math.inf, "--lr must be > 0, got inf"),
        ("temperature", math.inf, "--temperature must be > 0"),
        ("temperature", 0.0, "--temperature must be > 0"),
        ("top_p", 1.5, r"--top-p must be in \(0, 1\]"),
        ("max_grad_norm", -1.0, "--max-grad-norm must be > 0"),
        ("max_grad_norm", 0.0, "--max-grad-norm must be > 0"),
        ("weight_decay", -1.0, "--weight-decay must be >= 0"),
        ("warmup", -5, "--warmup must be >= 0"),
        ("lr_schedule", "step", "--lr-schedule must be one of constant, linear, cosine"),
        ("seed", -1, r"--seed must be in \[0, 4.29497e\+09\]"),
        ("seed", 10**20, r"--seed must be in \[0"),
        ("steps", 2.5, "--steps must be a whole number"),
        ("prompts", True, "--prompts must be a number"),
        ("devices", 0, "--devices must be >= 1"),
        ("lora_rank", -1, "--lora-rank must be >= 0"),
        ("lora_rank", 2.5, "--lora-rank must be a whole number"),
        ("lora_alpha", 0.0, "--lora-alpha must be > 0"),
        ("lora_alpha", math.nan, "--lora-alpha must be > 0, got nan"),
        ("lora_modules", "q_proj,qkv", "--lora-modules: unknown module 'qkv'; choose from q_proj"),
        ("lora_modules", " , ", "--lora-modules: none named"),
        ("logit_chunk", -1, "--logit-chunk must be >= 0"),
        ("logit_chunk", 1.5, "--logit-chunk must be a whole number"),
    ],
)
def test_out_of_range_options_are_refused_naming_the_flag(option, value, message):
    with pytest.raises(ConfigError, match=message):
        validate(TrainConfig(objective="sft").replace(**{option: value}), SFT(), device_count=1)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_a_decaying_schedule_needs_steps_after_its_warmup(schedule):
    config = TrainConfig(objective="sft").replace(lr_schedule=schedule, steps=5, warmup=4)
    validate(config, SFT(), device_count=1)
    message = (
        r"--warmup \(10\) must be below the run's 10 optimizer steps "
        rf"\(--steps x --updates-per-rollout\) for --lr-schedule {schedule}"
    )
    with pytest.raises(ConfigError, match=message):
        validate(config.replace(warmup=10, updates_per_rollout=2), SFT(), device_count=1)
    # A constant learning rate has no horizon: any warmup is fine.
    validate(config.replace(lr_schedule="constant", warmup=10), SFT(), device_count=1)


def test_a_range_describes_itself_as_a_reader_writes_it():
    assert Range(0, math.inf, low_open=True, high_open=True).describe() == "> 0"
    assert Range(1, math.inf).describe() == ">= 1"
    assert Range(0, 1, low_open=True).describe() == "in (0, 1]"
    assert not Range(0, 1).contains(math.nan)
    assert Range(-math.inf, math.inf).contains(math.inf)


def test_unknown_options_are_named():
    with pytest.raises(ConfigError, match="unknown option 'learning_rate'"):
        TrainConfig().replace(learning_rate=0.1)
