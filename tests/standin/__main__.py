"""``python -m tests.standin --port N [--state FILE] [--watch-list]``: the API stand-in
as a process.

Prints ``listening on http://HOST:PORT`` (flushed) once it serves, so a parent can
read the port when started with ``--port 0``; ``--port-file`` also writes it. The
``--state`` file (JSON or YAML: a ``{"items": [...]}`` list or a YAML stream of
objects) seeds the store. Stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import yaml

from tests.standin.apiserver import ApiServer


def _load_state(path: Path) -> list[Any]:
    items: list[Any] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is None:
            continue
        if isinstance(doc, dict) and "items" in doc and "metadata" not in doc:
            items.extend(doc["items"] or [])
        elif isinstance(doc, dict) and doc.get("kind", "").endswith("List"):
            items.extend(doc.get("items") or [])
        elif isinstance(doc, list):
            items.extend(doc)
        else:
            items.append(doc)
    return items


async def _main(args: argparse.Namespace) -> int:
    server = ApiServer(
        host=args.host,
        port=args.port,
        token=args.token,
        bookmark_interval=args.bookmark_interval,
        history_size=args.history_size,
        watch_list=args.watch_list,
        ignore_send_initial_events=args.ignore_send_initial_events,
        version=args.version,
        kubelets=args.kubelets,
    )
    if args.state:
        try:
            server.load(_load_state(Path(args.state)))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            print(f"cannot load state file {args.state}: {exc}", file=sys.stderr)
            return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.port_file:
            await anyio.Path(args.port_file).write_text(str(server.port))
        print(f"listening on {server.url}", flush=True)
        await stop.wait()
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.standin", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the chosen port to this file")
    parser.add_argument("--state", help="seed objects from this JSON/YAML file")
    parser.add_argument("--token", help="require this bearer token")
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--history-size", type=int, default=10_000)
    parser.add_argument(
        "--watch-list",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serve streaming lists (sendInitialEvents), as kube-apiserver 1.32 and 1.34+ "
        "do by default; off (as in 1.33) refuses them with 422",
    )
    parser.add_argument(
        "--ignore-send-initial-events",
        action="store_true",
        help="serve a watch as if sendInitialEvents and resourceVersionMatch were never sent "
        "(a proxy that drops them, in front of a server without the feature)",
    )
    parser.add_argument(
        "--version", default="v1.33.0-standin", help="the gitVersion /version reports"
    )
    parser.add_argument(
        "--kubelets",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a kubelet on every node confirms a graceful pod deletion at once (the default); "
        "--no-kubelets: a bound pod deleted with a grace period stays, being deleted, as on a "
        "control plane without kubelets",
    )
    sys.exit(asyncio.run(_main(parser.parse_args())))


if __name__ == "__main__":
    main()
