"""Examples in the shapes users have them: lists of dicts, datasets, DataFrames, saved folders, the
Hugging Face cache (built here, never downloaded); each column reaches the rewards with its type."""

import re
import shutil
import sys

import pytest

from dew import cli
from dew.options import ConfigError
from dew.rewards import Reward
from dew.rollout import Prompter
from dew.tasks import Dataset, load_examples, to_examples
from dew.tokenizers import DIGITS
from dew.train import TrainConfig
from dew.train.assembly import resolve_task, with_data

datasets = pytest.importorskip("datasets")
pandas = pytest.importorskip("pandas")

ROWS = [
    {
        "prompt": f"^{a}{a + 1}>",
        "answer": f"{a + 1}{a}",
        "tests": [a, a + 1],
        "meta": {"level": a % 3, "tags": ["digits"]},
        "weight": a / 2,
        "n": a,
    }
    for a in range(8)
]


def test_every_shape_gives_the_same_examples_with_their_types():
    from_dataset = to_examples(datasets.Dataset.from_list(ROWS))
    from_frame = to_examples(pandas.DataFrame(ROWS))
    assert to_examples(ROWS) == from_dataset == from_frame == ROWS
    for rows in (from_dataset, from_frame):
        first = rows[1]
        assert type(first["tests"]) is list and type(first["meta"]) is dict
        assert type(first["n"]) is int and type(first["weight"]) is float
    with pytest.raises(ValueError, match="data row 2: no 'prompt' column"):
        to_examples([ROWS[0], {"question": "?"}])


def test_a_reward_function_gets_the_columns_as_the_dataset_has_them():
    seen = {}

    def probe(prompts, completions, **columns):
        seen.update(columns)
        return [0.0] * len(completions)

    task = Dataset(to_examples(datasets.Dataset.from_list(ROWS)), heldout=0)
    prompter = Prompter(task, DIGITS, rewards=(Reward("probe", probe),))
    examples = task.train[:2]
    prompter.score(examples, [DIGITS.encode("10$"), DIGITS.encode("2")])
    assert seen["tests"] == [[0, 1], [1, 2]]
    assert seen["meta"] == [{"level": 0, "tags": ["digits"]}, {"level": 1, "tags": ["digits"]}]
    assert seen["n"] == [0, 1] and seen["weight"] == [0.0, 0.5]


def test_train_takes_a_dataframe_a_dataset_or_a_path():
    for data in (pandas.DataFrame(ROWS), datasets.Dataset.from_list(ROWS), ROWS):
        config, task = with_data(TrainConfig(), data, None)
        assert config.data is None and task.name == "data"
        assert sorted(task.train + task.evaluation, key=lambda r: r["n"]) == ROWS
    assert with_data(TrainConfig(), "q.parquet", None) == (TrainConfig(data="q.parquet"), None)
    with pytest.raises(ConfigError, match="data row 1: no 'prompt'"):
        with_data(TrainConfig(), [{"question": "?"}], None)


def cache_entry(cache, name: str, rows):
    """A dataset as `datasets` leaves it in its cache once loaded: an Arrow file and its info."""
    owner, short = name.split("/")
    entry = cache / f"{owner}___{short}" / "default" / "0.0.0" / "0123abcd"
    entry.mkdir(parents=True)
    saved = cache.parent / "saved-for-cache"
    dataset = datasets.Dataset.from_list(rows)
    dataset.save_to_disk(str(saved))
    shutil.copy(next(saved.glob("*.arrow")), entry / f"{short}-train.arrow")
    split = datasets.SplitInfo("train", num_examples=len(rows), dataset_name=short)
    datasets.DatasetInfo(
        dataset_name=short,
        config_name="default",
        features=dataset.features,
        splits=datasets.SplitDict({"train": split}),
    ).write_to_directory(str(entry))


def test_data_reads_a_saved_folder_and_a_cached_dataset_never_downloading(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_examples(tmp_path / "saved") == ROWS
    cache_entry(tmp_path / "cache", "me/questions", ROWS)
    assert load_examples("me/questions:train") == ROWS
    task = resolve_task(TrainConfig(data="me/questions:train"))
    assert len(task.train) + len(task.evaluation) == len(ROWS)
    with pytest.raises(ValueError, match="no split 'test'; cached: train"):
        load_examples("me/questions:test")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    splits.save_to_disk(str(tmp_path / "both"))
    with pytest.raises(ValueError, match=r"holds several splits; pass one of .*both/train"):
        load_examples(tmp_path / "both")
    argv = ["train", "--objective", "sft", "--model", "tiny", "--data", "me/missing:train"]
    capsys.readouterr()  # datasets' own progress lines so far
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dew: error: --data me/missing:train: not in the local Hugging Face")
    assert len(err.splitlines()) == 1


def test_a_cached_dataset_without_the_datasets_library_names_the_command_that_installs_it(
    monkeypatch,
):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    message = "install the dew extra 'datasets' with `uv sync --extra datasets` in the checkout"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_examples("me/questions:train")
