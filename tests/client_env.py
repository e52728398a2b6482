"""The official Python client, ``queen-mq``, in a virtualenv of its own.

Its import package is also named ``queen``, so it cannot share an environment with this
broker. ``ensure_client_python()`` builds ``.venv-client`` at the repository root on first use
(``python -m venv`` + ``pip install``) and reuses it afterwards; ``scripts/test.sh`` runs this
module so a fresh machine gets it before the tests start.

    python -m tests.client_env      # build or check it; prints the interpreter path
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLIENT_REQUIREMENT = "queen-mq==2.6.0"
CLIENT_VERSION = CLIENT_REQUIREMENT.split("==")[1]
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-client"


def client_python() -> Path:
    return VENV / "bin" / "python"


def _has_client(python: Path) -> bool:
    if not python.exists():
        return False
    check = f"import queen, sys; sys.exit(queen.__version__ != {CLIENT_VERSION!r})"
    done = subprocess.run([str(python), "-I", "-c", check], check=False, capture_output=True)
    return done.returncode == 0


def ensure_client_python() -> Path:
    """The interpreter of a virtualenv holding the official client; built if missing.

    Raises RuntimeError with pip's output if it cannot be installed.
    """
    python = client_python()
    if _has_client(python):
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            CLIENT_REQUIREMENT,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if install.returncode != 0 or not _has_client(python):
        raise RuntimeError(
            f"cannot install {CLIENT_REQUIREMENT} into {VENV}:\n{install.stdout}{install.stderr}"
        )
    return python


if __name__ == "__main__":
    print(ensure_client_python())
