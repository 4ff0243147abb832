"""`engine doctor`: every section is printed and the command exits 0 on this machine."""

from __future__ import annotations

from engine.cli.doctor import cpu_section
from engine.cli.main import main


def test_doctor_prints_every_section_and_exits_0(tmp_path, capsys):
    store = tmp_path / "store"
    (store / "envs" / "abc123").mkdir(parents=True)
    (store / "envs" / "abc123" / "kiln-env.json").write_text('{"requirements": ["onnxruntime==1.0"]}', encoding="utf-8")
    (store / "objects").mkdir()
    (store / "objects" / "blob").write_bytes(b"x" * 2048)
    assert main(["doctor", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    for title in ("CPU", "GPUs", "onnxruntime", "onnxruntime-genai", "OpenVINO", "store and environments"):
        assert title in out
    for kind in ("onnxruntime", "onnxruntime-genai", "openvino"):
        assert f"target {kind}" in out
    assert "ISA" in out and "providers" in out and "CPUExecutionProvider" in out
    assert "1 in" in out and "onnxruntime==1.0" in out  # the cached isolated environment
    assert "2.0 KiB" in out
    assert "built with cuda" in out


def test_cpu_section_reads_model_and_isa_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Test CPU 9000\nflags\t\t: fpu sse4_2 avx2 avx512f avx512_vnni amx_int8\n", encoding="utf-8")
    rows = dict(cpu_section(cpuinfo).rows)
    assert rows["model"] == "Test CPU 9000"
    assert rows["ISA"] == "sse4_2, avx2, avx512f, avx512_vnni, amx_int8"
