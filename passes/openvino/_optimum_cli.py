"""``python -m passes.openvino._optimum_cli export openvino ...``: optimum-intel's own command line
(``optimum-cli``), run by ``openvino_optimum_convert`` in its environment.

One thing is done before optimum is imported: PyPI's torchvision (which optimum-intel requires)
is built against PyPI's CUDA torch and fails to import beside the CPU build of torch that Kiln
pins ("operator torchvision::nms does not exist"); transformers then fails on its first model
import. A decoder's export does not use torchvision, so when it cannot be imported it is marked
absent (``sys.modules["torchvision"] = None``: ``import torchvision`` raises ImportError and
``importlib.util.find_spec`` returns None, which is how transformers checks for it).
"""

from __future__ import annotations

import sys


def hide_broken_torchvision() -> bool:
    """Mark torchvision absent when it cannot be imported; True when it was."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a RuntimeError from its C++ operators, or an ImportError
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None  # type: ignore[assignment]
        return True
    return False


def main(argv: list[str]) -> int:
    if hide_broken_torchvision():
        print("torchvision cannot be imported beside this torch: treated as absent", file=sys.stderr)
    from optimum.commands.optimum_cli import main as optimum_cli

    sys.argv = ["optimum-cli", *argv]
    optimum_cli()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
