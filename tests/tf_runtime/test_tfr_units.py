"""Small pure units: replica grouping, fetch keys, progress, report(), backends, launcher."""

from __future__ import annotations

import collections
import ctypes.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tf_runtime
from tf_runtime import runtime
from tf_runtime.fetches import fetch_key, flatten
from tf_runtime.gpu_release import CpuBackend, CudaDriver, select_backend
from tf_runtime.progress import ProgressMeter
from tf_runtime.replicas import VarSpec, group_replicas


def spec(name: str, shape: tuple[int, ...] = (2, 3)) -> VarSpec:
    return VarSpec(name, shape, "float32")


def test_towers_are_grouped_by_name_modulo_the_tower_prefix() -> None:
    names = [f"tower_{i}/{v}" for i in range(4) for v in ("fc/w", "fc/w/Momentum", "fc/b")]
    groups, replicas = group_replicas([spec(n) for n in names] + [spec("global_step", ())])
    assert replicas == 4
    by = {g.canonical: g.members for g in groups}
    assert by["fc/w"] == tuple(f"tower_{i}/fc/w" for i in range(4))
    assert by["global_step"] == ("global_step",)
    assert set(by) == {"fc/w", "fc/w/Momentum", "fc/b", "global_step"}


def test_tf_cnn_benchmarks_style_v0_prefixes() -> None:
    groups, replicas = group_replicas([spec(f"v{i}/cg/conv0/kernel") for i in range(2)])
    assert replicas == 2 and groups[0].canonical == "cg/conv0/kernel"


def test_towers_that_differ_are_not_merged() -> None:
    specs = [spec("gpu_0/layer1/w"), spec("gpu_1/layer2/w")]  # model parallel, not replicas
    groups, replicas = group_replicas(specs)
    assert replicas == 1 and sorted(g.canonical for g in groups) == ["gpu_0/layer1/w", "gpu_1/layer2/w"]
    shapes = [spec("tower_0/w", (2,)), spec("tower_1/w", (3,))]
    assert group_replicas(shapes)[1] == 1


def test_clash_with_an_unprefixed_variable_keeps_towers_apart() -> None:
    groups, _ = group_replicas([spec("w"), spec("tower_0/w"), spec("tower_1/w")])
    assert sorted(g.canonical for g in groups) == ["tower_0/w", "tower_1/w", "w"]


def test_fetch_keys_are_stable_for_rebuilt_structures() -> None:
    a, b = object(), object()
    assert fetch_key([a, b]) == fetch_key([a, b])
    assert fetch_key({"caller": [a], "hook": b}) == fetch_key({"caller": [a], "hook": b})
    assert fetch_key([a, b]) != fetch_key([b, a])
    assert fetch_key("loss:0") == fetch_key("loss" + ":0")
    Pair = collections.namedtuple("Pair", "x y")
    assert flatten({"c": [a, (b, Pair(1, 2))], "d": "s"}) == [a, b, 1, 2, "s"]


def test_rate_is_a_moving_average_and_suspension_is_not_a_slow_step() -> None:
    m = ProgressMeter(alpha=0.5)
    m.step(2.5, 1.0)  # the first mini-batch: TensorFlow's set-up, not the job's pace
    assert m.snapshot().rate == 0.0  # not measured yet
    for t in (1.1, 1.2, 1.3):
        m.step(0.1, t)
    assert m.snapshot().rate == pytest.approx(10.0)
    m.pause()  # suspended for a minute
    m.step(0.1, 61.3)
    assert m.snapshot().rate == pytest.approx(10.0)
    assert m.snapshot().steps == 5


def test_each_report_says_when_the_job_went_on_from_its_step() -> None:
    """The scheduler times a job's rate alone by these (scheduler/alone.py), not by when a
    busy event loop read the reports: a step's end, or a pause's (a resume) after it."""
    m = ProgressMeter()
    assert m.snapshot().step_at == 0.0  # none yet
    before = time.time()
    m.step(0.1, 1.0)
    ended = m.snapshot().step_at
    assert before <= ended <= time.time() and m.went_on_at(1) == ended
    time.sleep(0.01)
    m.pause()  # suspended, then resumed: it goes on from step 1 now
    assert ended < m.snapshot().step_at <= time.time()
    m.set_steps(41)  # restored: no time known for step 41 until its next boundary
    assert m.snapshot().step_at == 0.0
    m.step(0.1, 2.0)
    assert m.snapshot().steps == 42 and m.snapshot().step_at > ended


def test_report_validates_and_publishes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="accuracy='high' is not a number"):
        tf_runtime.report(accuracy="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not finite"):
        tf_runtime.report(loss=float("nan"))
    tf_runtime.report(accuracy=0.5)  # no runtime: only logged
    rt = runtime.start({"GANDIVA_RESTORE_CHECKPOINT": "", "GANDIVA_WARM": "1",
                        "GANDIVA_CONTROL_FD": "99"})
    try:
        assert rt is not None
        tf_runtime.report(val_accuracy=0.875)
        assert rt.controller.meter.snapshot().metrics == {"val_accuracy": 0.875}
    finally:
        from tf_runtime import shim

        shim.uninstall()
        runtime._RUNTIME.clear()


def test_standalone_installs_nothing() -> None:
    assert runtime.start({"GANDIVA_JOB_ID": "j"}) is None


def test_bad_environment_is_named() -> None:
    with pytest.raises(ValueError, match="GANDIVA_JOB_ID is empty"):
        runtime.start({"GANDIVA_SCHEDULER": "127.0.0.1:1"})
    with pytest.raises(ValueError, match="GANDIVA_STATUS_FD='x' is not an integer"):
        runtime.start({"GANDIVA_STATUS_FD": "x"})
    with pytest.raises(ValueError, match="GANDIVA_GPU_RELEASE='tpu'"):
        select_backend("tpu")


def test_launcher_refuses_an_incomplete_restore_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    (tmp_path / "half").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    proc = subprocess.run([sys.executable, "-m", "tf_runtime.run", str(script)],
                          env={**env, "GANDIVA_RESTORE_CHECKPOINT": str(tmp_path / "half")},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "no gandiva.json" in proc.stderr
    assert "trained" not in proc.stdout
    ok = subprocess.run([sys.executable, "-m", "tf_runtime.run", str(script), "--flag"],
                        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0 and ok.stdout == "trained\n"
    missing = subprocess.run([sys.executable, "-m", "tf_runtime.run", str(tmp_path / "nope.py")],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode == 2 and "no such script" in missing.stderr


def test_a_directory_or_zip_application_runs_as_python_runs_it(tmp_path: Path) -> None:
    """`python trainer/` (a directory with a __main__.py) or `python app.pyz` (a zipapp, as
    shiv or pex build): the helper starts `python -m tf_runtime.run trainer/`, which used to
    refuse the directory ("no such script", exit 2) though python runs it. Now both run as
    under python: the directory or zip first on sys.path (not the one above it), absolute,
    as is `__file__`, and `sys.argv[0]` as given."""
    import zipapp

    app = tmp_path / "trainer"
    app.mkdir()
    (app / "helper.py").write_text("X = 5\n")
    (app / "__main__.py").write_text(
        "import os, sys, helper\nhere = os.path.join(os.getcwd(), sys.argv[0])\n"
        "print(helper.X, sys.argv, sys.path[0] == here, __file__ == os.path.join(here, '__main__.py'), "
        f"{str(tmp_path)!r} in sys.path)\n")
    zipapp.create_archive(app, tmp_path / "app.pyz")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    for target in ("trainer", "app.pyz"):
        plain = subprocess.run([sys.executable, target, "--x"], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, check=False)
        shim = subprocess.run([sys.executable, "-m", "tf_runtime.run", target, "--x"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert (shim.returncode, shim.stdout) == (0, f"5 [{target!r}, '--x'] True True False\n") == (
            plain.returncode, plain.stdout), (target, shim.stderr)


def test_a_symlinked_script_imports_the_modules_beside_its_target(tmp_path: Path) -> None:
    """`python train.py` where train.py is a link to the project's script (an experiment
    directory of links): python puts the target's directory on sys.path, so its sibling
    modules import; tf_runtime.run put the link's directory there, and the job failed at
    its first import (ModuleNotFoundError). Its `__builtins__` is the builtins module, as in
    python's own __main__ (under tf_runtime.run it was a dict: AttributeError), and its
    `__file__` absolute (it was as given: after a chdir its data beside it was not found),
    and it is still `__main__` for its atexit work, without `__file__` as python leaves it
    (runpy put tf_runtime.run's module back, `__file__` kept)."""
    (tmp_path / "code").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "code" / "model.py").write_text("X = 7\n")
    (tmp_path / "runs" / "data.txt").write_text("beside")
    (tmp_path / "code" / "train.py").write_text(
        "import atexit, os, sys, model\n__builtins__.seen = model.X\nos.chdir('/')\n"
        "print(seen, open(os.path.join(os.path.dirname(__file__), 'data.txt')).read(), sys.argv[0])\n"
        "atexit.register(lambda: print(hasattr(sys.modules['__main__'], 'model'), '__file__' in globals()))\n")
    (tmp_path / "runs" / "train.py").symlink_to(tmp_path / "code" / "train.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    for argv in ([sys.executable, "train.py"], [sys.executable, "-m", "tf_runtime.run", "train.py"]):
        out = subprocess.run(argv, env=env, cwd=tmp_path / "runs", capture_output=True, text=True,
                             timeout=60, check=False)
        assert (out.returncode, out.stdout) == (0, "7 beside train.py\nTrue False\n"), (argv, out.stderr)


def test_a_program_with_its_own_scheduler_and_protos_modules_gets_the_shim(tmp_path: Path) -> None:
    """A project with a `scheduler.py` (learning-rate schedules) and a `protos/` package beside
    its script, imported before or after TensorFlow: the shim's `from scheduler import
    transport` found the program's module and the shim did not start ("cannot import name
    'transport' from 'scheduler'"), the job uncontrollable. Now the shim imports Gandiva's
    own (tf_runtime/own_modules.py) and the program still gets its own by those names."""
    (tmp_path / "scheduler.py").write_text("def lr(step):\n    return 0.5\n")
    (tmp_path / "protos").mkdir()
    (tmp_path / "protos" / "__init__.py").write_text("NAME = 'theirs'\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import scheduler\n"
            "from tf_runtime import client\n"
            "import protos\n"
            "print(scheduler.lr(0), protos.NAME, client.transport.__name__, client.runtime_pb2.__name__)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    assert (out.returncode, out.stdout) == (
        0, "0.5 theirs scheduler.transport protos.gandiva.v1.runtime_pb2\n"), out.stderr


def test_script_exit_status_passes_through(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nsys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    proc = subprocess.run([sys.executable, "-m", "tf_runtime.run", str(script), "a", "b"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3 and proc.stdout == "['a', 'b']\n"


def test_cpu_backend_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = select_backend()
    assert isinstance(backend, CpuBackend) and backend.releases_memory


CUDA_CHILD = """
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(rc):
    assert rc == 0, rc
ok(cu.cuInit(0)); dev = ctypes.c_int(); ok(cu.cuDeviceGet(ctypes.byref(dev), 0))
ctx = ctypes.c_void_p(); ok(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
n = 64 << 20
ptr = ctypes.c_uint64(); ok(cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)))
src = (ctypes.c_ubyte * n)(*([7] * 16)); ok(cu.cuMemcpyHtoD_v2(ptr, src, ctypes.c_size_t(n)))
print("ready", flush=True); sys.stdin.readline()
dst = (ctypes.c_ubyte * n)(); ok(cu.cuMemcpyDtoH_v2(dst, ptr, ctypes.c_size_t(n)))
print("ok" if bytes(dst[:16]) == bytes([7] * 16) else "corrupt", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.skipif(ctypes.util.find_library("cuda") is None,
                    reason="no NVIDIA driver (libcuda) on this machine; the CUDA process "
                           "checkpoint backend needs a GPU server")
def test_cuda_checkpoint_releases_and_restores_device_memory() -> None:
    from tf_runtime.gpu_release import CudaCheckpointBackend, ReleaseError

    try:
        driver = CudaDriver.load()
    except ReleaseError as exc:
        pytest.skip(f"driver without the process checkpoint API: {exc}")
    child = subprocess.Popen([sys.executable, "-c", CUDA_CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        backend = CudaCheckpointBackend(pid=child.pid)
        backend.release()
        assert driver.state(child.pid) == "checkpointed"
        backend.reacquire()
        assert driver.state(child.pid) == "running"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ok"  # device memory came back intact
    finally:
        child.kill()
        child.wait()


def test_a_forked_child_leaves_the_parents_stream_alone(runtime_server: Any, tmp_path: Path) -> None:
    """A program that forks (os.fork, a multiprocessing pool) and whose child ends through
    the interpreter's exit: the child used to close the parent's gRPC stream at exit,
    which hangs after a fork (and the parent waiting for it with it)."""
    script = tmp_path / "forks.py"
    # The program forks only once its stream is up (the test answers on stdin after the
    # server has its hello): the child must not disturb a live stream, and on a loaded
    # machine a stream still connecting when the parent finishes proves nothing.
    script.write_text(
        "import os, sys\n"
        "from tf_runtime import runtime\n"
        "rt = runtime.start()\n"
        "sys.stdin.readline()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    rt.finish()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "rt.finish()\n"
        "print('parent done')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="fork", GANDIVA_SCHEDULER=runtime_server.address,
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        runtime_server.wait_for(lambda j, m: j == "fork" and m.HasField("hello"), 60)
        seen = len(runtime_server.messages)
        try:
            out, err = proc.communicate("fork now\n", timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"the forked child hung at exit: {proc.communicate()[1]!r}") \
                from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "parent done" in out, err
    # The parent's own finish() still reached the scheduler over its stream: the last
    # progress report is sent at close, after the child has exited.
    early = {id(m) for _, m in runtime_server.messages[:seen]}
    runtime_server.wait_for(
        lambda j, m: j == "fork" and m.HasField("progress") and id(m) not in early, 10)


def test_a_child_process_is_secondary_while_the_first_lives(tmp_path: Path) -> None:
    """GANDIVA_RUNTIME_PID names the job's first runtime process: a live ancestor makes
    this one secondary (the helper's pipes are not its own: here a closed descriptor,
    which used to stop the child at its TensorFlow import); its own pid, or a pid that has
    ended, does not."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert runtime._owner({"GANDIVA_RUNTIME_PID": str(os.getppid())}) == os.getppid()
    assert runtime._owner({"GANDIVA_RUNTIME_PID": str(os.getpid())}) is None
    assert runtime._owner({"GANDIVA_RUNTIME_PID": str(dead.pid)}) is None
    assert runtime._owner({"GANDIVA_RUNTIME_PID": "junk"}) is None
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    rt = runtime.start({"GANDIVA_RUNTIME_PID": str(os.getppid()), "GANDIVA_JOB_ID": "j",
                        "GANDIVA_STATUS_FD": str(closed), "GANDIVA_CONTROL_FD": str(closed)})
    try:
        assert rt is not None and rt.controller.status is None and rt.client is None
        assert "GANDIVA_RUNTIME_PID" not in os.environ  # a dict env marks nothing
    finally:
        from tf_runtime import shim

        shim.uninstall()
        runtime._RUNTIME.clear()
    with pytest.raises(ValueError, match="GANDIVA_STATUS_FD"):  # the first process's are
        runtime.start({"GANDIVA_JOB_ID": "j", "GANDIVA_STATUS_FD": str(closed)})


def test_a_launcher_that_imports_tensorflow_hands_the_stream_to_its_trainer(
        runtime_server: Any, tmp_path: Path) -> None:
    """`python launch.py`, which imports TensorFlow (to list the devices) and then runs the
    training script with `subprocess`: the launcher connects first, never trains; the
    trainer connects at its first training step and the job's commands reach it. The
    trainer used to exit at its import: the status pipe's descriptor, named in its
    environment, is closed in a Python subprocess."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import subprocess, sys\n"
        "import tensorflow as tf\n"
        "print(tf.config.list_physical_devices(), flush=True)\n"
        "sys.exit(subprocess.call([sys.executable, sys.argv[1], '--loop', 'session',\n"
        "                          '--steps', '400', '--step-sleep', '0.02']))\n")
    from tf_runtime.autoload import path_with_autoload

    env = {k: v for k, v in os.environ.items() if not k.startswith("GANDIVA_")}
    env.update(GANDIVA_JOB_ID="launched", GANDIVA_INCARNATION="0",
               GANDIVA_SCHEDULER=runtime_server.address,
               PYTHONPATH=path_with_autoload(str(Path(__file__).resolve().parents[2])))
    trainer = str(Path(tf_runtime.__file__).parent / "examples" / "feed_step.py")
    status_r, status_w = os.pipe()  # the helper's status pipe, as every launch has it
    env["GANDIVA_STATUS_FD"] = str(status_w)
    proc = subprocess.Popen([sys.executable, "-m", "tf_runtime.run", str(launcher), trainer],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            pass_fds=(status_w,))
    os.close(status_w)
    try:
        first = runtime_server.wait_for(lambda j, m: j == "launched" and m.HasField("hello"),
                                        60).hello
        assert first.pid == proc.pid
        child = runtime_server.wait_for(lambda j, m: j == "launched" and m.HasField("hello")
                                        and m.hello.pid != proc.pid, 120).hello
        ack = runtime_server.wait_ack(runtime_server.send("launched", 1, ""), 60)  # SUSPEND
        assert ack.ok and ack.step >= 1, ack.message
        progress = runtime_server.wait_for(
            lambda j, m: j == "launched" and m.HasField("progress") and m.progress.steps >= 1,
            30).progress
        assert progress.steps >= 1
        ack = runtime_server.wait_ack(runtime_server.send("launched", 2, ""), 60)  # RESUME
        assert ack.ok, ack.message
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        with os.fdopen(status_r) as status:
            events = status.read()
    assert proc.returncode == 0, out
    assert child.pid != first.pid and "done at step 400" in out
    assert "first_step_done" not in events  # the pipe is the launcher's, which never trains
