import sys

import pytest

from pearl.report.tensorboard import ScalarLog


def test_scalars_land_in_tensorboard_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = ScalarLog(tmp_path)
    assert board.enabled
    for step in range(3):
        board.scalars("train", {"reward": 0.5 * step, "roles": "1C", "ok": True}, step)
    board.scalars("train", {"loss": float("nan")}, 3)  # not finite: skipped
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/reward"]
    assert [e.value for e in events.Scalars("train/reward")] == [0.0, 0.5, 1.0]


def test_without_tensorboard_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    board = ScalarLog(tmp_path)
    board.scalars("train", {"reward": 1.0}, 0)
    board.close()
    assert not board.enabled and not (tmp_path / "tb").exists()
