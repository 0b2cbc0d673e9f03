"""tf_runtime.own_checkpoints: a program's own Saver in a restored process takes up the
checkpoints it wrote before the restore (which its uninterrupted run would prune). Without
TensorFlow; live: `test_tfr_programs_more.py -k summarised`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tf_runtime.own_checkpoints import recover


class FakeSaver:
    def __init__(self, max_to_keep: int | None = 3, known: list[str] | None = None) -> None:
        self.saver_def = SimpleNamespace(max_to_keep=max_to_keep)
        self.last_checkpoints = list(known or [])

    def recover_last_checkpoints(self, paths: list[str]) -> None:
        self.last_checkpoints = list(paths)


def _state(listed: list[str]) -> Any:
    calls: list[tuple[str, Any]] = []

    def state_of(directory: str, latest: Any) -> Any:
        calls.append((directory, latest))
        return SimpleNamespace(all_model_checkpoint_paths=listed)
    state_of.calls = calls  # type: ignore[attr-defined]
    return state_of


def test_the_checkpoints_of_its_prefix_that_exist_are_taken_up_in_its_own_form() -> None:
    listed = ["/w/ck/model.ckpt-3", "/w/ck/model.ckpt-6", "/w/ck/other-6", "/w/ck/model.ckpt-9"]
    gone = {"ck/model.ckpt-9"}
    saver = FakeSaver()
    state_of = _state(listed)
    got = recover(saver, "ck/model.ckpt", "latest", state_of, lambda p: None if p in gone else 10.0, 5.0)
    # Relative as the program's save_path is (TensorFlow's state gives absolute paths), so
    # its next save of the same name replaces the entry rather than listing it twice.
    assert got == saver.last_checkpoints == ["ck/model.ckpt-3", "ck/model.ckpt-6"]
    assert state_of.calls == [("ck", "latest")]  # type: ignore[attr-defined]


def test_a_saver_that_knows_its_checkpoints_or_prunes_none_is_left_alone() -> None:
    state_of = _state(["/w/model-3"])
    for saver in (FakeSaver(known=["/w/model-6"]), FakeSaver(max_to_keep=None), FakeSaver(0)):
        before = list(saver.last_checkpoints)
        assert recover(saver, "/w/model", None, state_of, lambda p: 10.0, 5.0) == []
        assert saver.last_checkpoints == before
    assert state_of.calls == []  # type: ignore[attr-defined]
    no_state = FakeSaver()
    assert recover(no_state, "model", None, lambda d, f: None, lambda p: 10.0, 5.0) == []
    assert no_state.last_checkpoints == []


def test_another_savers_checkpoints_whose_prefix_extends_its_own_are_not_taken_up() -> None:
    # A second Saver (its best model, max_to_keep=1) saving into the same directory and
    # state file as "model.ckpt-best-N": its checkpoints are no steps of "model.ckpt", and
    # the uninterrupted run's "model.ckpt" Saver never deletes them.
    listed = ["/w/model.ckpt-best-40", "/w/model.ckpt-30", "/w/model.ckpt-x", "/w/model.ckpt-"]
    saver = FakeSaver()
    got = recover(saver, "/w/model.ckpt", None, _state(listed), lambda p: 10.0, 5.0)
    assert got == saver.last_checkpoints == ["/w/model.ckpt-30"]


def test_checkpoints_written_before_the_job_started_are_not_taken_up() -> None:
    # The program restores a run of its own from before this job (fine-tuning, a job run
    # again) from the directory it saves into; the job is migrated before its first save, so
    # the state file still lists the old run's checkpoints. The uninterrupted run's Saver
    # never deletes them (a Saver prunes only what it wrote); only the job's own are taken up.
    listed = ["/w/model.ckpt-1000", "/w/model.ckpt-2000", "/w/model.ckpt-2100"]
    written = {"/w/model.ckpt-1000": 50.0, "/w/model.ckpt-2000": 60.0, "/w/model.ckpt-2100": 120.0}
    saver = FakeSaver()
    got = recover(saver, "/w/model.ckpt", None, _state(listed), written.get, 100.0)
    assert got == saver.last_checkpoints == ["/w/model.ckpt-2100"]
    unknown = FakeSaver()  # a checkpoint of Gandiva's that does not say when the job started
    assert recover(unknown, "/w/model.ckpt", None, _state(listed), written.get, None) == []
