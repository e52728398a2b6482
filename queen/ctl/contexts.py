"""queenctl's contexts, read (never written): ``~/.queen/config.yaml``, or ``QUEEN_CONFIG``,
or ``--config``.

A context names a broker (``server``), optionally a token (``token-ref``) and ``insecure``
(no TLS check). It is chosen by ``--context``, else ``QUEEN_CONTEXT``, else the file's
``current-context``; a broker or token given by flag or environment wins over it (the order
is in ``docs/command.md``). A token reference is ``env`` (``QUEEN_TOKEN``), ``file:///path``,
or ``literal:<token>``; ``keychain://...`` lives in the operating system's keychain, which
``queen`` does not read (it says so, and goes on without a token): give that token with
``QUEEN_TOKEN`` or ``--token``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from queen.ctl.client import usage


@dataclass(frozen=True, slots=True)
class Context:
    name: str
    server: str | None
    token: str | None
    insecure: bool


def config_path(given: str | None) -> Path:
    if given:
        return Path(given).expanduser()
    env = os.environ.get("QUEEN_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".queen" / "config.yaml"


def load_context(config: str | None, name: str | None, *, token_given: bool) -> Context | None:
    """The context to use, or ``None`` when there is no file, or it names none. A context
    named explicitly (``--context``, ``QUEEN_CONTEXT``) that the file lacks is a usage
    error, as are a file that does not parse and a token that cannot be read (unless a token
    is given otherwise: ``token_given``)."""
    path = config_path(config)
    chosen = name or os.environ.get("QUEEN_CONTEXT") or None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if config or chosen:
            raise usage(f"context {chosen!r}: no queenctl config at {path}") from None
        return None
    except OSError as exc:
        raise usage(f"cannot read {path}: {exc.strerror or exc}") from None
    import yaml

    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise usage(f"{path} is not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise usage(f"{path}: expected a mapping with contexts")
    chosen = chosen or data.get("current-context") or None
    if not chosen:
        return None
    for entry in data.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == chosen:
            return Context(
                name=str(chosen),
                server=str(entry["server"]) if entry.get("server") else None,
                token=None if token_given else _token(entry.get("token-ref"), str(chosen)),
                insecure=bool(entry.get("insecure")),
            )
    raise usage(f"context {chosen!r} is not in {path}")


def _token(ref: Any, context: str) -> str | None:
    if not ref:
        return None
    text = str(ref)
    if text == "env":
        return os.environ.get("QUEEN_TOKEN") or None
    if text.startswith("literal:"):
        return text.removeprefix("literal:")
    if text.startswith("file://"):
        path = Path(text.removeprefix("file://")).expanduser()
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise usage(
                f"context {context!r}: cannot read its token {path}: {exc.strerror or exc}"
            ) from None
    if text.startswith("keychain://"):
        click.echo(
            f"queen: context {context!r} keeps its token in the system keychain ({text}), "
            "which queen does not read; going on without one (give it with QUEEN_TOKEN or "
            "--token)",
            err=True,
        )
        return None
    raise usage(f"context {context!r}: unknown token-ref {text!r}")
