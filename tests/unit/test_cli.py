"""The command line itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gpusizer


def test_building_the_command_line_loads_no_simulator_library() -> None:
    """`gpusizer run` builds the whole parser, `simulate`'s options included: numpy and
    matplotlib loaded there were 26 MiB of every operator's memory."""
    probe = (
        "import sys; from gpusizer.cli import build_parser; build_parser(); "
        "print(' '.join(m for m in ('numpy', 'matplotlib', 'pandas') if m in sys.modules))"
    )
    package_root = Path(gpusizer.__file__).resolve().parents[1]
    loaded = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(package_root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loaded == ""
