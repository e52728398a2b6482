"""The broker's HTTP API as the ``queen`` operator commands call it.

One synchronous :class:`BrokerClient` per command run (``httpx.Client``: one connection kept
alive across the calls of a command). Every failure becomes a :class:`CtlError` carrying the
exit status a script can rely on (:class:`Exit`), with a one-line message: the broker down,
a token refused or lacking a role (the broker's 403 names the roles the route needs), or the
broker's own error text. ``verify=False`` (``--insecure``) skips the TLS certificate check.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import click
import httpx
import outcome

DEFAULT_URL = "http://127.0.0.1:6632"
INTERRUPT_CHECK_S = 0.2

T = TypeVar("T")


def default_url() -> str:
    """The broker beside this command: this host, at ``QUEEN_PORT`` when it is set (the port
    ``queen serve`` listens on, so a command run where the broker runs, as in its container,
    finds it), else 6632."""
    port = os.environ.get("QUEEN_PORT", "").strip()
    if port.isdigit() and 0 < int(port) < 65536:
        return f"http://127.0.0.1:{int(port)}"
    return DEFAULT_URL


class Exit(enum.IntEnum):
    """Exit statuses of the operator commands (``docs/command.md``). 0 to 4 mean what they
    mean to queenctl; 5 is ours."""

    OK = 0
    USAGE = 1  # bad command line or bad input; nothing was sent
    BROKER = 2  # no answer (refused, timed out, name unknown), or an error answer: not found,
    # conflict, a server error; a broker that is not healthy; an operation that failed
    AUTH = 3  # authentication refused (401) or a role missing (403)
    EMPTY = 4  # done, and there was nothing to do: no message to pop, nothing to push or ack,
    # nothing to retry, drain or delete
    REFUSED = 5  # the broker took the request and refused some of its items: a push item
    # failed, an acknowledgment was refused (a stale lease)
    INTERRUPTED = 130  # Ctrl-C


class CtlError(click.ClickException):
    """A failure shown as one line, ``queen: <message>``, with its exit status."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code
        # click declares exit_code on the class; this failure carries its own
        object.__setattr__(self, "exit_code", int(code))

    def show(self, file: Any = None) -> None:
        click.echo(f"queen: {self.message}", err=True)


def usage(message: str) -> CtlError:
    return CtlError(message, Exit.USAGE)


def segment(name: str) -> str:
    """One path segment: a queue, partition, group or transaction id, percent-encoded."""
    return quote(name, safe="")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any  # decoded JSON, the text of a non-JSON answer, or None (204)


class BrokerClient:
    """Calls one broker. ``timeout_s`` bounds each call (a long poll adds its own wait)."""

    def __init__(
        self, url: str, token: str | None, timeout_s: float, *, verify: bool = True
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"User-Agent": "queen-ctl"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        return self.call("GET", path, params=params, **kw).body

    def post(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.call("POST", path, body=body, **kw).body

    def delete(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        return self.call("DELETE", path, params=params, **kw).body

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        wait_s: float = 0.0,
        accept: frozenset[int] = frozenset(),
    ) -> Answer:
        """One request. A 2xx answer, or a status in ``accept``, is returned; anything else
        raises :class:`CtlError`."""
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        timeout = httpx.Timeout(self.timeout_s + wait_s, connect=self.timeout_s)
        try:
            resp = interruptible(
                lambda: self._http.request(
                    method,
                    path,
                    params=query,
                    json=body,
                    headers=dict(headers or {}),
                    timeout=timeout,
                )
            )
        except httpx.TimeoutException:
            raise CtlError(
                f"broker at {self.url} did not answer {method} {path} within "
                f"{self.timeout_s + wait_s:g} s",
                Exit.BROKER,
            ) from None
        except httpx.TransportError as exc:
            raise CtlError(
                f"broker unreachable at {self.url}: {_reason(exc)}", Exit.BROKER
            ) from None
        answer = Answer(resp.status_code, _decode(resp))
        if resp.is_success or resp.status_code in accept:
            return answer
        raise _refusal(method, path, answer)


def interruptible(call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread, waited for in slices of :data:`INTERRUPT_CHECK_S`: Ctrl-C
    ends a command within that time, whatever the request is doing. (Python runs a signal's
    handler between bytecodes, or when a blocking system call is interrupted; a SIGINT that
    lands between the last check and the receive of a long poll would otherwise wait for the
    poll's whole timeout.) The request's thread is abandoned to the exit."""
    result: list[outcome.Outcome[T]] = []
    done = threading.Event()

    def run() -> None:
        result.append(outcome.capture(call))  # an exception too, raised by the waiting thread
        done.set()

    threading.Thread(target=run, name="queen-request", daemon=True).start()
    while not done.wait(INTERRUPT_CHECK_S):
        pass
    return result[0].unwrap()


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decode(resp: httpx.Response) -> Any:
    if resp.status_code == 204 or not resp.content:
        return None
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            return resp.json()
        except ValueError:
            return resp.text
    return resp.text


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    if "Connection refused" in text:
        return "connection refused (is queen serve running? set QUEEN_URL or --url)"
    return text


def error_text(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    if isinstance(body, str) and body.strip():
        return body.strip().splitlines()[0][:200]
    return "no detail"


def _refusal(method: str, path: str, answer: Answer) -> CtlError:
    what = f"{method} {path}"
    if answer.status == 401:
        return CtlError(
            f"authentication refused for {what}: {error_text(answer.body)} "
            "(give a token with QUEEN_TOKEN or --token)",
            Exit.AUTH,
        )
    if answer.status == 403:
        roles = answer.body.get("required") if isinstance(answer.body, dict) else None
        if isinstance(roles, list) and roles:
            names = " + ".join(str(r) for r in roles)
            held = "it" if len(roles) == 1 else "them all"
            needs = f"the route needs the role {names}, and the token does not hold {held}"
        else:
            needs = error_text(answer.body)
        return CtlError(f"permission refused for {what}: {needs}", Exit.AUTH)
    return CtlError(f"{what} failed ({answer.status}): {error_text(answer.body)}", Exit.BROKER)


def require_queue(ctl: Any, queue: str) -> None:
    """Exit 2 (``queue 'x' not found``) unless the broker knows ``queue``: for the routes that
    answer an unknown queue as an empty one (pop, clear)."""
    known = ctl.client.call(
        "GET",
        f"/api/v1/resources/queues/{segment(queue)}",
        params={"limit": 1},
        accept=frozenset({404}),
    )
    if known.status == 404:
        raise CtlError(f"queue {queue!r} not found", Exit.BROKER)
