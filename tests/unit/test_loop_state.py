"""The loop's durable record: a new run keeps its config, each completed phase survives a
restart, and a resume finds the run by id or as the last one."""

import pytest
from typer.testing import CliRunner

from deploy.cli.main import app
from loop.config import LoopConfig
from loop.state import LoopState


def test_a_run_keeps_its_config_and_completed_phases_across_reopening(tmp_path):
    lc = LoopConfig(env="pkg.mod:Tasks", env_args={"seed": 3}, turns=2, algo="rs", seed=5)
    state = LoopState.open(tmp_path, None, lc)
    state.record("0.eval", {"exact_solve": 0.25})
    again = LoopState.open(tmp_path, state.run_id, None)
    assert again.config == lc and again.done("0.eval") == {"exact_solve": 0.25}
    assert again.done("1.rollouts") is None and state.run_id.endswith("-s5")


def test_resume_last_is_the_newest_run_and_an_unknown_run_is_a_clear_error(tmp_path):
    import os
    import time

    older = LoopState.open(tmp_path, None, LoopConfig(seed=1))
    newer = LoopState.open(tmp_path, None, LoopConfig(seed=2))
    past = time.time() - 60
    os.utime(older.path, (past, past))
    assert LoopState.open(tmp_path, "last", None).run_id == newer.run_id
    with pytest.raises(FileNotFoundError, match="no loop run 'nope'"):
        LoopState.open(tmp_path, "nope", None)
    with pytest.raises(FileNotFoundError, match="to resume"):
        LoopState.open(tmp_path / "empty", "last", None)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "no_such_module_here"], "No module named 'no_such_module_here'"),
        (["--env", "envs.vf_wordops:NoSuchTaskset"], "has no 'NoSuchTaskset'"),
        (["--resume", "nope"], "no loop run 'nope'"),
    ],
)
def test_a_taskset_or_run_that_is_not_there_fails_before_anything_starts(tmp_path, args, message):
    done = CliRunner().invoke(app, ["loop", *args, "--set", f"home={tmp_path}"])
    assert done.exit_code == 2 and message in " ".join(done.output.split()), done.output
    assert not (tmp_path / "run").exists()  # no stack was started


def test_bad_loop_options_are_usage_errors(tmp_path):
    for args in (["--algo", "ppo"], ["--env-arg", "seed"]):
        done = CliRunner().invoke(app, ["loop", *args, "--set", f"home={tmp_path}"])
        assert done.exit_code == 2, done.output
