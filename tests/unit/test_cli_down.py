"""`flywheel down` for a profile with nothing up says where a stack is up instead."""

import os
import subprocess

from typer.testing import CliRunner

from deploy.cli.main import app


def _said(done) -> str:
    return " ".join(done.output.split())  # the console wraps long lines


def test_a_down_that_finds_nothing_names_the_profile_whose_stack_is_up_and_leaves_it_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the stock profiles' homes are relative: .flywheel, .flywheel-sim...
    run = tmp_path / ".flywheel-sim" / "run"
    run.mkdir(parents=True)
    (run / "gateway.pid").write_text(str(os.getpid()))  # a live process of sim's stack

    done = CliRunner().invoke(app, ["down", "-p", "local"])
    assert done.exit_code == 0, done.output
    assert f"nothing was running in {tmp_path / '.flywheel'}" in _said(done)
    assert "profile sim is up: flywheel down -p sim" in _said(done)
    assert (run / "gateway.pid").read_text() == str(os.getpid())

    gone = subprocess.Popen(["true"])
    gone.wait()
    (run / "gateway.pid").write_text(str(gone.pid))  # sim's process has exited: nothing to point to
    done = CliRunner().invoke(app, ["down", "-p", "local"])
    assert done.exit_code == 0 and "flywheel down -p" not in _said(done), done.output
