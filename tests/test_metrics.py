"""Metrics logging: strict-JSON lines (NaN/inf included), resume truncation, TensorBoard events, ranks, console."""
import io
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from mindgrpo.train.metrics import METRIC_ALIASES, METRIC_NAMES, MetricsLogger, read_metrics, throughput_tps


def _strict_json(line: str):
    """json.loads that refuses the NaN/Infinity literals Python would otherwise accept."""
    def refuse(literal):
        raise AssertionError(f"non-standard JSON literal {literal} in {line!r}")
    return json.loads(line, parse_constant=refuse)


def _lines(path: Path) -> list[dict]:
    return [_strict_json(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _logger(tmp_path, **kwargs) -> MetricsLogger:
    kwargs.setdefault("tensorboard", False)
    kwargs.setdefault("stream", io.StringIO())
    return MetricsLogger(tmp_path, **kwargs)


def test_jsonl_is_strict_json_with_non_finite_values(tmp_path):
    with _logger(tmp_path) as logger:
        logger.log(1, {"actor/pg_loss": float("nan"), "grad_norm": float("inf"), "actor/kl_loss": -math.inf,
                       "grpo/rewards/mean": np.float32(0.5), "response_length/max": np.int64(300), "counter": 2})
        logger.log(2, {"actor/pg_loss": 0.25})

    first, second = _lines(tmp_path / "metrics.jsonl")
    assert list(first)[:2] == ["step", "time"] and first["step"] == 1 and isinstance(first["time"], float)
    assert (first["actor/pg_loss"], first["grad_norm"], first["actor/kl_loss"]) == ("nan", "inf", "-inf")
    assert first["grpo/rewards/mean"] == 0.5 and first["response_length/max"] == 300 and first["counter"] == 2
    assert second["step"] == 2 and second["actor/pg_loss"] == 0.25

    records = read_metrics(tmp_path)  # the folder or the file both work
    assert repr(records) == repr(read_metrics(tmp_path / "metrics.jsonl"))  # repr: nan != nan
    assert math.isnan(records[0]["actor/pg_loss"]) and records[0]["grad_norm"] == math.inf
    assert records[0]["actor/kl_loss"] == -math.inf and records[1]["actor/pg_loss"] == 0.25
    assert type(records[0]["response_length/max"]) is int


class _DeviceScalar:
    """Stands in for a 0-d MindSpore tensor: a dtype without numpy's `.kind`, converted with float()."""
    dtype, ndim = "Float32", 0

    def __float__(self) -> float:
        return 0.75


def test_scalars_of_any_framework_are_converted(tmp_path):
    _logger(tmp_path).log(1, {"a": _DeviceScalar(), "b": np.array(0.25), "c": np.bool_(True), "d": np.float64(2)})
    (record,) = _lines(tmp_path / "metrics.jsonl")
    assert (record["a"], record["b"], record["c"], record["d"]) == (0.75, 0.25, 1, 2.0)
    assert type(record["d"]) is float and type(record["c"]) is int


def test_bad_metric_values_are_named(tmp_path):
    logger = _logger(tmp_path)
    with pytest.raises(TypeError, match="metric 'actor/entropy' must be a scalar number"):
        logger.log(1, {"actor/entropy": np.ones(3)})
    with pytest.raises(ValueError, match="metric name 'step' is invalid"):
        logger.log(1, {"step": 3})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_truncate_after_on_resume_leaves_no_duplicates(tmp_path):
    with _logger(tmp_path) as first_run:
        for step in range(1, 6):
            first_run.log(step, {"grpo/rewards/mean": step / 10})
            first_run.log_completions(step, [{"prompt": "p", "completion": f"c{step}"}])

    with _logger(tmp_path) as resumed:  # resumed from the checkpoint of step 3: steps 4 and 5 are redone
        resumed.truncate_after(3)
        for step in (4, 5):
            resumed.log(step, {"grpo/rewards/mean": step})

    records = _lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["grpo/rewards/mean"] for r in records] == [0.1, 0.2, 0.3, 4, 5]
    assert [r["completion"] for r in _lines(tmp_path / "completions.jsonl")] == ["c1", "c2", "c3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["completions.jsonl", "metrics.jsonl"]


def test_torn_last_line_is_repaired_and_bad_lines_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "time": 0, "a": 1}\nnot json\n{"step": 2, "time": 0, "a": 2}\n{"step": 3, "ti')
    with pytest.warns(UserWarning, match="removed a partial last line"):
        logger = _logger(tmp_path)
    logger.log(3, {"a": 3})
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:2: skipping unreadable line"):
        records = read_metrics(path)
    assert [(r["step"], r["a"]) for r in records] == [(1, 1), (2, 2), (3, 3)]


def _read_events(folder: Path) -> list:
    """Parse TFRecord event files by hand (tensorboard itself is not installed): length, crc, data, crc."""
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    events = []
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no event files in {folder}"
    for file in files:
        data, pos = file.read_bytes(), 0
        while pos < len(data):
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(header)
            payload = data[pos + 12:pos + 12 + length]
            assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == masked_crc32c(payload)
            events.append(event_pb2.Event.FromString(payload))
            pos += 16 + length
    return events


def _scalars(events) -> list[tuple[str, int, float]]:
    return [(v.tag, e.step, v.simple_value) for e in events if e.HasField("summary") for v in e.summary.value]


def test_tensorboard_events_hold_every_scalar(tmp_path):
    logged = {1: {"actor/pg_loss": 0.5, "grpo/rewards/mean": 0.25, "grad_norm": float("nan")},
              2: {"actor/pg_loss": -1.5, "grpo/rewards/mean": 0.75, "grad_norm": 3.0}}
    with _logger(tmp_path, tensorboard=True) as logger:
        for step, metrics in logged.items():
            logger.log(step, metrics)

    scalars = _scalars(_read_events(tmp_path / "tensorboard"))
    assert len(scalars) == 6
    for tag, step, value in scalars:
        expected = logged[step][tag]
        assert (math.isnan(value) and math.isnan(expected)) or value == expected, (tag, step)
    assert {(tag, step) for tag, step, _ in scalars} == {(t, s) for s, m in logged.items() for t in m}


def test_tensorboard_purges_redone_steps_on_resume(tmp_path):
    with _logger(tmp_path, tensorboard=True) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"grad_norm": step})
    with _logger(tmp_path, tensorboard=True) as logger:
        logger.truncate_after(2)
        logger.log(3, {"grad_norm": 30.0})

    events = _read_events(tmp_path / "tensorboard")
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2  # second run did not overwrite
    starts = [e.step for e in events if e.HasField("session_log") and e.session_log.status == e.session_log.START]
    assert starts == [3]  # TensorBoard drops earlier events with step >= 3 when it sees this
    assert sorted(_scalars(events)) == [("grad_norm", 1, 1.0), ("grad_norm", 2, 2.0), ("grad_norm", 3, 3.0),
                                        ("grad_norm", 3, 30.0)]


def test_non_zero_ranks_write_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    stream = io.StringIO()
    with MetricsLogger(out, rank=1, tensorboard=True, total_steps=5, stream=stream) as logger:
        logger.truncate_after(0)
        logger.log(1, {"grpo/rewards/mean": 1.0})
        logger.log_completions(1, [{"prompt": "p", "completion": "c"}])
    assert not out.exists()
    assert stream.getvalue() == "" and capsys.readouterr() == ("", "")


def test_completions_are_readable_records(tmp_path):
    records = [
        {"prompt": "Natalia sold 48 clips…", "completion": "Wait, let me re-check.\n48 / 2 = 24 ≈ <answer>72</answer>",
         "gold": "72", "reward": np.float32(1.5), "rewards": {"accuracy": 1.0, "format": np.float64(0.5)},
         "advantage": float("nan"), "group": 0, "token_ids": np.array([[1, 2]], dtype=np.int32)},
        {"prompt": "p2", "completion": "no answer"},
    ]
    logger = _logger(tmp_path)
    logger.log_completions(12, records)
    with pytest.raises(ValueError, match=r"record 0 lacks \['completion'\]"):
        logger.log_completions(13, [{"prompt": "only a prompt"}])

    text = (tmp_path / "completions.jsonl").read_text(encoding="utf-8")
    assert "Wait, let me re-check." in text and "≈" in text  # grep-able, no \\u escapes
    first, second = _lines(tmp_path / "completions.jsonl")
    assert list(first)[:6] == ["step", "reward", "rewards", "gold", "prompt", "completion"]
    assert first["step"] == 12 and first["reward"] == 1.5 and first["rewards"] == {"accuracy": 1.0, "format": 0.5}
    assert first["completion"] == records[0]["completion"] and first["gold"] == "72"
    assert first["advantage"] == "nan" and first["group"] == 0 and first["token_ids"] == [[1, 2]]
    assert second == {"step": 12, "reward": None, "rewards": {}, "gold": None, "prompt": "p2",
                      "completion": "no answer"}


_STEP = {"e2e_tps": 12345.6, "timing/all": 41.23, "response_length/mean": 245.3, "actor/kl_loss": 0.001,
         "grad_norm": 9.0, "actor/pg_loss": -0.0123, "grpo/rewards/mean": 0.5}


def test_console_plain_line_in_fixed_order(tmp_path):
    stream = io.StringIO()
    with MetricsLogger(tmp_path, tensorboard=False, total_steps=10, stream=stream) as logger:
        logger.log(3, _STEP)
        logger.log(4, {"actor/pg_loss": float("nan")})
    assert stream.getvalue().splitlines() == [
        "step 3/10 | reward 0.5 | pg_loss -0.0123 | kl 0.001 | resp_len 245.3 | step_s 41.23 | e2e_tps 12346",
        "step 4/10 | pg_loss nan",
    ]
    quiet = io.StringIO()
    MetricsLogger(tmp_path / "quiet", tensorboard=False, console=False, stream=quiet).log(1, _STEP)
    assert quiet.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_progress_bar_on_a_terminal(tmp_path):
    stream = _Terminal()
    with MetricsLogger(tmp_path, tensorboard=False, total_steps=10, stream=stream) as logger:
        logger.log(3, _STEP)  # a resumed run: the bar starts at step 3, not 1
        logger.log(4, _STEP)
    output = stream.getvalue()
    assert "step 3/10 | reward 0.5" in output and "step 4/10 | reward 0.5" in output
    assert "4/10" in output.replace("step 4/10", "") and "\r" in output  # tqdm's bar, redrawn in place


def test_throughput_formula_on_hand_computed_numbers():
    # (100 + 300) tokens * 4 prompts * 8 samples = 12800 tokens over 2 devices and 16 s -> 400 tok/s/device
    assert throughput_tps(100, 300, 4, 8, 2, 16.0) == 400.0
    # (50.5 + 149.5) * 2 * 4 = 1600 tokens on 1 device in 10 s
    assert throughput_tps(50.5, 149.5, 2, 4, 1, 10.0) == pytest.approx(160.0)
    with pytest.raises(ValueError, match="seconds must be > 0"):
        throughput_tps(1, 1, 1, 1, 1, 0.0)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        throughput_tps(1, 1, 1, 1, 0, 1.0)


def test_metric_names_cover_the_standard_set():
    required = {"timing/all", "timing/rollout", "timing/reference_model", "timing/old_log_p", "timing/update",
                "timing/weight_sync", "actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac",
                "actor/ppo_kl", "grad_norm", "grpo/lr", "grpo/rewards/mean", "grpo/rewards/max", "grpo/rewards/min",
                "e2e_tps", "update_tps", "rollout_tps", "memory/peak_rss_gib"}
    required |= {f"{kind}_length/{stat}" for kind in ("response", "prompt") for stat in ("mean", "max", "min")}
    assert set(METRIC_NAMES) == required and len(METRIC_NAMES) == len(required)


def test_old_mindrlhf_names_are_written_as_aliases_in_jsonl_only(tmp_path):
    """For one release metrics.jsonl also carries each renamed metric under its MindRLHF name; TensorBoard and the
    console keep to the new names."""
    assert METRIC_ALIASES == {"rollout_tps": "vllm_tps", "timing/weight_sync": "timing/resharding_to_infer"}
    assert set(METRIC_ALIASES) <= set(METRIC_NAMES) and not set(METRIC_ALIASES.values()) & set(METRIC_NAMES)
    with _logger(tmp_path, tensorboard=True) as logger:
        logger.log(1, {"rollout_tps": 123.0, "timing/weight_sync": 0.5, "grad_norm": 1.0})
        logger.log(2, {"grad_norm": 2.0})  # a step without the renamed metrics gets no aliases either

    first, second = _lines(tmp_path / "metrics.jsonl")
    assert first["vllm_tps"] == first["rollout_tps"] == 123.0
    assert first["timing/resharding_to_infer"] == first["timing/weight_sync"] == 0.5
    assert set(second) == {"step", "time", "grad_norm"}
    tags = {tag for tag, _, _ in _scalars(_read_events(tmp_path / "tensorboard"))}
    assert tags == {"rollout_tps", "timing/weight_sync", "grad_norm"}
