"""The container image: built by ``deploy/build-image.sh`` from Debian packages and PyPI alone,
then run with podman as an operator would: as a non-root user, configured by environment, its
health check passing, pushes and pops answered, a stop (SIGTERM) ending it cleanly.

Two runs of the one image: on a PostgreSQL beside it (``DATABASE_URL``, the compose example's
shape) and on its own embedded PostgreSQL (no database setting at all, state in its volume).

Needs root with Debian's debootstrap, buildah, podman and runc (``scripts/test.sh`` installs
them when it runs as root); anywhere else the test is skipped and says which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from queen.storage.embedded import EmbeddedPostgres
from tests.conftest import TEST_SERVER_OPTIONS, embedded_pg_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("debootstrap", "buildah", "podman", "runc")

# How this test starts a container, and why:
# - runc: crun refuses hosts whose cgroups are v1 with a v2 hierarchy beside them ("hybrid");
#   runc works there and everywhere else.
# - explicit, modest rlimits: podman's defaults raise RLIMIT_NOFILE/RLIMIT_NPROC, which a host
#   without CAP_SYS_RESOURCE refuses ("setrlimit: Operation not permitted").
# - the host's network: the broker and the test's PostgreSQL meet on 127.0.0.1.
RUN_FLAGS = (
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=8192:8192",
    "--ulimit",
    "nproc=4096:4096",
    "--network",
    "host",
)


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the image build needs root (debootstrap); run the suite as root"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"missing {', '.join(absent)}: apt-get install {' '.join(absent)}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    why = _missing()
    if why is not None:
        pytest.skip(why)
    tag = f"localhost/queen-trio:test-{uuid.uuid4().hex[:8]}"
    built = subprocess.run(
        [str(ROOT / "deploy" / "build-image.sh"), tag],
        check=False,
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL on a TCP port of 127.0.0.1, as a database beside the container."""
    with embedded_pg_dir() as data:
        port = free_port()
        server = EmbeddedPostgres(
            data,
            server_options={
                **TEST_SERVER_OPTIONS,
                "listen_addresses": "127.0.0.1",
                "port": str(port),
            },
        )
        server.start()
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            server.stop("immediate")


class Container:
    def __init__(self, image: str, env: dict[str, str]) -> None:
        self.name = f"queen-test-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        flags = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        podman(
            "run",
            "--detach",
            "--name",
            self.name,
            *RUN_FLAGS,
            "-e",
            f"QUEEN_PORT={self.port}",
            *flags,
            image,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_listening(self, within_s: float = 180) -> None:
        """Follow the container's log until the broker says it listens (or the container
        ends: then its log is the failure)."""
        with subprocess.Popen(
            ["podman", "logs", "--follow", self.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as follow:
            timer = threading.Timer(within_s, follow.kill)
            timer.start()
            try:
                assert follow.stdout is not None
                for line in follow.stdout:
                    if f"listening on http://0.0.0.0:{self.port}" in line:
                        return
                raise AssertionError(f"the broker never listened:\n{self.logs()}")
            finally:
                timer.cancel()
                follow.kill()

    def inspect(self) -> dict[str, object]:
        out = podman("inspect", self.name).stdout
        return json.loads(out)[0]  # type: ignore[no-any-return]

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def remove(self) -> None:
        podman("rm", "--force", "--time", "5", self.name, check=False)


def exercise(container: Container) -> None:
    """What an operator checks of a fresh container: who it runs as, its health check, a push
    and a pop, and a clean stop."""
    container.wait_listening()
    assert httpx.get(f"{container.url}/health", timeout=10).status_code == 200
    assert podman("exec", container.name, "id", "-u").stdout.strip() != "0"
    assert container.inspect()["Config"]["User"] == "queen"  # type: ignore[index]
    # The image's own HEALTHCHECK command, run inside the container.
    assert podman("healthcheck", "run", container.name, check=False).returncode == 0
    queue = f"ctr-{uuid.uuid4().hex[:6]}"
    pushed = httpx.post(
        f"{container.url}/api/v1/push",
        json={"items": [{"queue": queue, "partition": "p", "payload": {"n": n}} for n in range(3)]},
        timeout=10,
    )
    assert pushed.status_code == 201, pushed.text
    assert [item["status"] for item in pushed.json()] == ["queued"] * 3
    popped = httpx.get(f"{container.url}/api/v1/pop/queue/{queue}?batch=10", timeout=10)
    assert popped.status_code == 200, popped.text
    assert [m["data"]["n"] for m in popped.json()["messages"]] == [0, 1, 2]
    stopped = podman("stop", "--time", "30", container.name, timeout=60)
    assert stopped.returncode == 0
    state = container.inspect()["State"]
    assert state["ExitCode"] == 0, container.logs()  # type: ignore[index]
    assert "shutting down" in container.logs()


def test_the_image_runs_as_a_non_root_user_on_a_database_beside_it(
    image: str, postgres: str
) -> None:
    container = Container(image, {"DATABASE_URL": postgres})
    try:
        exercise(container)
        assert "database: embedded" not in container.logs()
    finally:
        container.remove()


def test_the_image_runs_its_own_embedded_database_without_settings(image: str) -> None:
    container = Container(image, {})
    try:
        exercise(container)
        assert "embedded PostgreSQL at /var/lib/queen/pgdata" in container.logs()
    finally:
        container.remove()
