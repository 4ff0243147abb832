"""How the `engine` command ends: it exits when its work is done, a reader that closes the pipe
early ends it quietly, and a damaged store has its own exit code."""

from __future__ import annotations

import os
import subprocess

from engine.cli.main import main
from engine.store.store import Store
from tests.engine.engine_helpers import engine_cmd, tiny_workflow, write_workflow


def _env(tmp_path, **extra: str) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "KILN_LOG_DIR": str(tmp_path / "logs"), **extra}


def test_doctor_exits_and_openvino_sends_no_telemetry(tmp_path):
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [*engine_cmd(), "doctor", "--store", str(tmp_path / "store")],
        capture_output=True, text=True, timeout=180, env=_env(tmp_path), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "OpenVINO" in done.stdout
    # a user who never answered counts as consenting to openvino_telemetry: it would write its
    # client id and send from a thread that never ends offline
    assert not (tmp_path / "home" / "intel" / "openvino_ga_cid").exists()


def test_a_reader_closing_the_pipe_early_ends_the_command_quietly(tmp_path):
    for args in (["schema"],):  # output larger than a pipe's buffer: written while the reader is gone
        process = subprocess.Popen([*engine_cmd(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path, COLUMNS="80"))
        assert process.stdout is not None and process.stderr is not None
        process.stdout.readline()
        process.stdout.close()  # `engine schema | head -1`
        stderr = process.stderr.read().decode()
        code = process.wait(timeout=120)
        assert code == 141, (args, code, stderr)  # 128 + SIGPIPE, as a shell reports a command killed by it
        assert "bug in Kiln" not in stderr and "Traceback" not in stderr, stderr
        assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())


def test_main_returns_141_on_a_closed_stdout(monkeypatch):
    def broken() -> dict[str, object]:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("engine.cli.schema_doc.full_schema", broken)
    assert main(["schema"]) == 141


def test_a_damaged_stored_model_exits_4_and_names_the_repair(tmp_path, tiny_onnx, capsys, monkeypatch):
    workflow = tiny_workflow(tiny_onnx, select={"objective": {"metric": "size.file_bytes", "goal": "min"}})
    workflow["evaluate"] = [{"id": "size", "evaluator": "size"}]
    path = write_workflow(tmp_path, workflow)
    check = Store.check_object

    def damaged(self: Store, digest: str, kind: str | None = None, full: bool = False) -> str | None:
        return "no longer matches its digest" if full else check(self, digest, kind, full)

    monkeypatch.setattr(Store, "check_object", damaged)  # the full check on delivery only
    code = main(["run", str(path), "--store", str(tmp_path / "store"), "-o", str(tmp_path / "out"), "-q", "-j", "1"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "the store is damaged" in err and "engine verify --repair" in err
