"""An ASGI app served by uvicorn for as long as the process that started it lives.

``python -m rayseq.episodes.child_server APP --port P --parent PID`` serves ``APP`` (``package.module:app``) on
127.0.0.1:P and exits as soon as process PID is gone. A server started by an environment (the OpenEnv adapter's) would
otherwise outlive a rollout worker or environment actor that is killed (``ray.kill``, a lost node, SIGKILL): no
``atexit`` runs then, and the orphan would keep its port and memory for the rest of the machine's life.

The watch is the child's own (its parent pid polled on a thread), not the kernel's parent-death signal: that signal
follows the *thread* that forked, and an environment actor starts servers from the threads of its pool.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

POLL_S = 0.5  # how often the parent's life is checked


def alive(pid: int) -> bool:
    """Process ``pid`` exists (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def watch_parent(parent: int, poll_s: float = POLL_S) -> threading.Thread:
    """A daemon thread that ends this process (exit status 0, no clean-up: the server holds nothing durable) once
    ``parent`` is gone or this process has been handed to another parent."""

    def run():
        while os.getppid() == parent and alive(parent):
            time.sleep(poll_s)
        os._exit(0)

    thread = threading.Thread(target=run, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rayseq.episodes.child_server", description=__doc__.split("\n\n")[0])
    ap.add_argument("app", help="package.module:app, the ASGI app to serve")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True, help="the pid whose end ends this server")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    watch_parent(args.parent)
    import uvicorn

    uvicorn.run(args.app, host="127.0.0.1", port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
