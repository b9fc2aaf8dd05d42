"""`--report-to`: what each tracker got, read back with the tracker's own reader; never the network.

Each tracker gets the same three steps of rows (reward parts, a held-out evaluation, a NaN),
the nested config and a sample table, then a resume sends two more: the reader must see every
metric at every step once, in the same tracker run, with the hyperparameters.
"""

import json
import math
import os
import struct
import tempfile
import warnings
from pathlib import Path

import pytest

from dew import cli
from dew.train import TrainConfig, train
from dew.train.runlog import read_metrics
from dew.train.trackers import _OPENERS, STATE, TRACKERS, Reporting, tracker_names

# trackio reads its store's folder once, when imported: a folder of the tests' own.
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="dew-trackio-"))

CONFIG = {"objective": "grpo", "task": "reverse", "run": {"steps": 5, "report_to": "x"}}
ROWS = [
    {"step": 1, "reward": 0.25, "reward/exact": 0.5, "loss": 1.5, "time": 0.1},
    {"step": 2, "reward": 0.5, "reward/exact": 0.75, "loss": 1.25, "eval/pass@1": 0.4},
    {"step": 3, "reward": 0.75, "reward/exact": 1.0, "loss": 1.0, "kl": float("nan")},
]
MORE = [
    {"step": 4, "reward": 0.8, "reward/exact": 1.0, "loss": 0.75},
    {"step": 5, "reward": 0.9, "reward/exact": 1.0, "loss": 0.5, "eval/pass@1": 0.6},
]
SAMPLES = [
    {"step": 3, "prompt": "^12>", "completion": "21|", "reward": 1.0, "rewards": {"exact": 1.0}},
    {"step": 3, "prompt": "^34>", "completion": "3", "reward": 0.0, "rewards": {"exact": None}},
]


def expected_series() -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for row in ROWS + MORE:
        for key, value in row.items():
            if key != "step":
                series.setdefault(key, []).append((row["step"], value))
    return series


def report_twice(name: str, run_dir: Path) -> None:
    """Three rows and the samples, then a resume (the first three kept) with two more."""
    first = Reporting({name: _OPENERS[name]}, run_dir)
    first.open(CONFIG, kept_rows=[])
    for row in ROWS:
        first.report(row)
    first.report_samples(3, SAMPLES)
    first.close("interrupted")
    resumed = Reporting({name: _OPENERS[name]}, run_dir)
    resumed.open({**CONFIG, "run": {"steps": 5, "report_to": "x"}}, kept_rows=ROWS)
    for row in MORE:
        resumed.report(row)
    resumed.close("finished")


def same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    return len(got) == len(want) and all(
        s == t and ((math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6))
        for (s, a), (t, b) in zip(got, want, strict=True)
    )


def test_tensorboard_reads_back_every_metric_step_and_hyperparameter(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    report_twice("tensorboard", tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for key, want in expected_series().items():
        got = [(event.step, event.value) for event in events.Scalars(key)]
        assert same(got, want), (key, got)
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["run.steps"].number_value == 5 and hparams["objective"].string_value == "grpo"
    assert [e.step for e in events.Tensors("samples/text_summary")] == [3]
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one folder


def wandb_records(run_dir: Path):
    """The records of the run's `.wandb` files, parsed with W&B's own protobuf messages.

    The file is a LevelDB-style log (W&B's transaction log): a 7-byte `:W&B` header, then
    32 KiB blocks of records, each a 4-byte checksum, 2-byte length, 1-byte type and its data.
    """
    from wandb.proto import wandb_internal_pb2

    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, offset, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while offset + 7 <= len(data):
            if 32768 - offset % 32768 < 7:  # a block's tail too short for a header is padding
                offset += 32768 - offset % 32768
                continue
            length, kind = struct.unpack("<HB", data[offset + 4 : offset + 7])
            pending += data[offset + 7 : offset + 7 + length]
            offset += 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                pending = b""
                yield record


def test_wandb_offline_files_hold_every_metric_step_and_hyperparameter(tmp_path, monkeypatch):
    for name, value in [("WANDB_MODE", "offline"), ("WANDB_SILENT", "true")]:
        monkeypatch.setenv(name, value)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "home"))
    import wandb

    report_twice("wandb", tmp_path)
    wandb.teardown()  # W&B's service may still be writing the last run's file after finish()
    run_id = json.loads((tmp_path / STATE).read_text())["wandb"]["id"]
    series: dict[str, list[tuple[int, float]]] = {}
    config, ids, tables, steps_with_table = {}, set(), [], []
    for record in wandb_records(tmp_path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            ids.add(record.run.run_id)
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or ".".join(item.nested_key)
                value = json.loads(item.value_json)
                if key == "samples.path":
                    files = tmp_path.glob(f"wandb/*/files/{value}")
                    tables += [json.loads(path.read_text()) for path in files]
                    steps_with_table.append(step)
                elif not key.startswith("_"):
                    number = math.nan if value in ("NaN", "nan") else value
                    series.setdefault(key, []).append((step, number))
    assert ids == {run_id}  # the resume continued the same run
    for key, want in expected_series().items():
        assert same(series[key], want), (key, series[key])
    assert config["run"]["steps"] == 5 and config["objective"] == "grpo"
    assert steps_with_table == [3] and len(tables) == 1
    assert tables[0]["columns"][:3] == ["step", "prompt", "completion"]
    assert len(tables[0]["data"]) == 2


def test_mlflow_client_reads_back_every_metric_step_and_param(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts go to ./mlruns
    report_twice("mlflow", tmp_path)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("dew").experiment_id])
    assert run.info.run_id == json.loads((tmp_path / STATE).read_text())["mlflow"]["run_id"]
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    for key, want in expected_series().items():
        history = client.get_metric_history(run.info.run_id, key.replace("@", "_at_"))
        got = [(m.step, m.value) for m in history]
        assert same(got, want), (key, got)
    assert run.data.params["run.steps"] == "5" and run.data.params["objective"] == "grpo"
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "samples"))
        .joinpath("step_000003.json")
        .read_text()
    )
    assert table["columns"][:3] == ["step", "prompt", "completion"] and len(table["data"]) == 2


def test_trackio_local_store_holds_every_metric_step_and_config(tmp_path, capsys):
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        report_twice("trackio", tmp_path)
    assert not [w for w in warned if "Reserved keys" in str(w.message)]  # trackio renames them
    finished = "* Run finished. Uploading logs to Trackio"
    assert capsys.readouterr().out.count(finished) == 2  # the first run and the resumed one
    with pytest.raises(RuntimeError):  # no run left for trackio's exit hook to finish again
        trackio.finish()
    logs = SQLiteStorage.get_logs("dew", tmp_path.name)
    assert not any("__time" in log for log in logs)
    series: dict[str, list[tuple[int, float]]] = {}
    for log in logs:
        for key, value in log.items():
            key = {"time_s": "time"}.get(key, key)  # `time` is reserved in trackio
            if key in expected_series():
                number = math.nan if value is None else value
                series.setdefault(key, []).append((log["step"], number))
    for key, want in expected_series().items():
        assert same(series[key], want), (key, series[key])
    assert [log["step"] for log in logs if "samples" in log] == [3]
    config = SQLiteStorage.get_run_config("dew", tmp_path.name)
    assert config["run"]["steps"] == 5 and config["objective"] == "grpo"


class Exploding:
    """A tracker whose disk fails at step 2."""

    def __init__(self, run):
        self.state, self.steps = {}, []

    def hyperparameters(self, config):
        pass

    def metrics(self, step, values):
        if step == 2:
            raise OSError(28, "No space left on device")
        self.steps.append(step)

    def samples(self, step, rows):
        pass

    def close(self, status):
        raise AssertionError("a dropped tracker is not closed")


def test_a_tracker_that_fails_is_one_warning_and_the_run_goes_on(tmp_path, capsys):
    exploding = Reporting({"exploding": Exploding}, tmp_path / "run")
    config = TrainConfig(objective="sft", model="tiny").replace(
        steps=3, prompts=4, out=str(tmp_path / "run"), report_to="tensorboard", samples_every=1
    )
    result = train(config, callbacks=[exploding], quiet=True)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "dew: warning: --report-to exploding failed (OSError: [Errno 28] No space left on "
        "device); the run goes on without it"
    ]
    assert [row["step"] for row in read_metrics(result.run_dir)] == [1, 2, 3]
    assert json.loads((result.run_dir / "end.json").read_text())["status"] == "finished"
    # The tracker --report-to asked for got the whole run, samples included.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(result.run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("reward")] == [1, 2, 3]
    assert [e.step for e in events.Tensors("samples/text_summary")] == [1, 2, 3]


def test_a_tracker_not_installed_is_a_one_line_error_naming_its_extra(capsys, monkeypatch):
    monkeypatch.setitem(TRACKERS, "wandb", "wandb_not_installed_here")
    argv = ["train", "--objective", "sft", "--model", "tiny", "--report-to", "tensorboard,wandb"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "dew: error: --report-to wandb: wandb_not_installed_here is not installed; install "
        "the dew extra 'wandb' with `uv sync --extra wandb` in the checkout"
    )
    with pytest.raises(ValueError, match="unknown tracker 'comet'"):
        tracker_names("tensorboard, comet")


def test_only_the_first_process_reports(tmp_path, monkeypatch):
    from dew.train import trainer as trainer_module

    config = TrainConfig(objective="sft", model="tiny").replace(
        steps=1, prompts=4, out=str(tmp_path / "run"), report_to="tensorboard"
    )
    kinds = {}
    for primary in (True, False):
        monkeypatch.setattr(trainer_module, "is_primary", lambda primary=primary: primary)
        built = trainer_module.Trainer(config.replace(out=str(tmp_path / f"run-{primary}")))
        built.lock.release()
        kinds[primary] = any(isinstance(c, Reporting) for c in built.callbacks)
    assert kinds == {True: True, False: False}
