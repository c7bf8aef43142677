"""python -m rayseq.serve — serve a trained checkpoint over HTTP (Ray Serve + FastAPI).

Run book
  python -m rayseq.serve --checkpoint runs/<run>                 # http://127.0.0.1:8000 (chat page at /)
  python -m rayseq.serve --checkpoint runs/<run>/checkpoints/ckpt_00001200.pt --port 8080 --host 0.0.0.0
  python -m rayseq.serve --checkpoint runs/<run> --replicas 2 --no-batching
  python -m rayseq.serve --checkpoint runs/<hf run> --engine vllm      # decoded by vLLM (pip install -e ".[vllm]")
  RAYSEQ_API_KEY=secret python -m rayseq.serve --checkpoint runs/<run>   # require "Authorization: Bearer secret"
  python -m rayseq.serve --config serve/chatbot.yaml --checkpoint runs/<run> --port 8080   # a Serve config file
  RAYSEQ_CHECKPOINT=runs/<run> serve run serve/chatbot.yaml      # the same file with Ray's own CLI

  curl -s localhost:8000/v1/chat -H 'Content-Type: application/json' -d '{"message": "9 2 3"}'

``--config`` reads the application's args and the HTTP host and port from a Serve config file; flags given
on the command line win. The checkpoint is checked before Ray starts: without one, or with a path that
holds none, the command stops at once with a one-line error and exit code 2. (Ray's ``serve run FILE``
builds the application inside the cluster, so there a missing checkpoint is a failed deployment shown in
its log and in ``serve status`` while the command keeps running.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m rayseq.serve", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", default=None,
                   help="run directory, checkpoint file, or URI (default: the config file's, else $RAYSEQ_CHECKPOINT)")
    p.add_argument("--config", default=None, help="a Serve config file (serve/chatbot.yaml): its args and port")
    p.add_argument("--host", default=None, help="default: the config file's, else 127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: the config file's, else 8000")
    p.add_argument("--replicas", type=int, default=None, help="default 1")
    p.add_argument("--no-batching", action="store_true", help="decode each request alone")
    p.add_argument("--max-batch-size", type=int, default=None, help="default 32")
    p.add_argument("--batch-wait-timeout-s", type=float, default=None, help="default 0.005")
    p.add_argument("--max-ongoing-requests", type=int, default=None, help="default 64")
    p.add_argument("--api-key", default=None, help="require this key (default: $RAYSEQ_API_KEY, else open)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default cpu")
    p.add_argument("--engine", default=None, choices=["builtin", "vllm"],
                   help="what decodes: builtin (default) or vllm (a model.arch=hf checkpoint; the vllm extra)")
    return p.parse_args(argv)


def read_serve_config(path: str) -> tuple[dict, dict, str, str]:
    """(application args, http_options, application name, route prefix) of the rayseq application in a
    Serve config file."""
    import yaml

    cfg = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in cfg.get("applications") or [] if a.get("import_path") == "rayseq.serving.app:build_app"]
    if not apps:
        raise ValueError(f"{path}: no application with import_path rayseq.serving.app:build_app")
    app = apps[0]
    return dict(app.get("args") or {}), dict(cfg.get("http_options") or {}), app.get("name", "rayseq-chat"), \
        app.get("route_prefix", "/")


def main(argv=None) -> int:
    args = parse_args(argv)
    from rayseq.serving.app import build_app

    app_args, http, name, prefix = {}, {}, "rayseq-chat", "/"
    try:
        if args.config:
            app_args, http, name, prefix = read_serve_config(args.config)
        flags = {"checkpoint": args.checkpoint, "replicas": args.replicas, "max_batch_size": args.max_batch_size,
                 "batch_wait_timeout_s": args.batch_wait_timeout_s, "max_ongoing_requests": args.max_ongoing_requests,
                 "api_key": args.api_key, "device": args.device, "batching": False if args.no_batching else None,
                 "engine": args.engine}
        app_args.update({k: v for k, v in flags.items() if v is not None})
        source = f" in {args.config}" if args.config else ""
        if not (app_args.get("checkpoint") or os.environ.get("RAYSEQ_CHECKPOINT")):
            raise ValueError(f"no checkpoint: pass --checkpoint runs/<run>, set RAYSEQ_CHECKPOINT=runs/<run>, "
                             f"or write it under args.checkpoint{source}")
        app = build_app(app_args)
    except (FileNotFoundError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    host = args.host or http.get("host") or "127.0.0.1"
    port = args.port or int(http.get("port") or 8000)
    checkpoint = app_args.get("checkpoint") or os.environ["RAYSEQ_CHECKPOINT"]
    from ray import serve

    from rayseq.distributed.runtime import dropping_log_messages, init_ray

    # Where rayseq starts Ray itself: no token-auth notice (init_ray), Serve's controller and proxies log
    # warnings and errors only (not their INFO route tables and replica bookkeeping), and serve.run does not claim
    # that the http_options serve.start just applied "will not be applied". On a cluster you started
    # (RAY_ADDRESS) Serve logs as configured there. Each request's access line still shows.
    embedded = init_ray()
    quiet = (dropping_log_messages("ray.serve", "Connecting to existing Serve app") if embedded
             else contextlib.nullcontext())
    # `kill PID` stops it as Ctrl-C does (this handler replaces Ray's, which dumps a native stack and exits without
    # stopping the Ray processes it started, whose agents ignore SIGTERM and stay behind)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _interrupt)
    try:  # from here on, Ctrl-C or SIGTERM (even during start-up) shuts Serve down
        serve.start(http_options={"host": host, "port": port},
                    logging_config={"log_level": "WARNING"} if embedded else None)
        with quiet:
            serve.run(app, name=name, route_prefix=prefix)
        print(f"serving {checkpoint} at http://{host}:{port}{prefix}  (chat page {prefix}, API docs {prefix}docs); "
              "Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        shut_down_quietly(serve, embedded)
        for sig, handler in handlers.items():  # (main() may run inside another program: its handlers back)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def shut_down_quietly(serve, embedded: bool) -> None:
    """Stop Serve (and the embedded Ray: every process it started) with further SIGINT/SIGTERM ignored, so the
    shutdown runs to its end, and without the lines Ray prints meanwhile: the controller's own graceful shutdown
    "failed ... killed by ray.kill" (serve.shutdown kills it once it has stopped the replicas and proxies)."""
    import io

    import ray

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        serve.shutdown()
        if embedded:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
