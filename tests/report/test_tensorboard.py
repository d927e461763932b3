import subprocess
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


FULL_DISK = """
import sys
from pearl.report.tensorboard import ScalarLog

board = ScalarLog(sys.argv[1])
worker = board.writer._get_file_writer().event_writer._async_writer._worker

class FullDisk:
    def write(self, data):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass

worker._record_writer = FullDisk()
board.scalars("train", {"reward": 1.0}, 0)
worker.join(10)
assert not worker.is_alive()
try:
    board.close()
except OSError as exc:
    print("caller saw:", exc)
"""


def test_a_failed_write_reaches_the_caller_without_a_thread_traceback(tmp_path):
    """A full disk under the writer's thread: the next call raises the OSError (the run
    reports it in one line) and stderr gets no traceback from the thread. In a process of
    its own: pytest replaces the thread hook during tests."""
    pytest.importorskip("tensorboard")
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "caller saw: [Errno 28] No space left on device" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr
