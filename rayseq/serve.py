"""python -m rayseq.serve — serve a trained checkpoint over HTTP (Ray Serve + FastAPI).

Run book
  python -m rayseq.serve --checkpoint runs/<run>                 # http://127.0.0.1:8000 (chat page at /)
  python -m rayseq.serve --checkpoint runs/<run>/checkpoints/ckpt_00001200.pt --port 8080 --host 0.0.0.0
  python -m rayseq.serve --checkpoint runs/<run> --replicas 2 --no-batching
  RAYSEQ_API_KEY=secret python -m rayseq.serve --checkpoint runs/<run>   # require "Authorization: Bearer secret"
  serve run serve/chatbot.yaml                                   # the same app from a Serve config file

  curl -s localhost:8000/v1/chat -H 'Content-Type: application/json' -d '{"message": "9 2 3"}'
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m rayseq.serve", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="run directory, checkpoint file, or URI")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--no-batching", action="store_true", help="decode each request alone")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-wait-timeout-s", type=float, default=0.005)
    p.add_argument("--max-ongoing-requests", type=int, default=64)
    p.add_argument("--api-key", default=None, help="require this key (default: $RAYSEQ_API_KEY, else open)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from rayseq.serving.app import build_app

    try:
        app = build_app({
            "checkpoint": args.checkpoint, "replicas": args.replicas, "batching": not args.no_batching,
            "max_batch_size": args.max_batch_size, "batch_wait_timeout_s": args.batch_wait_timeout_s,
            "max_ongoing_requests": args.max_ongoing_requests, "api_key": args.api_key, "device": args.device,
        })
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address)
        else:
            ray.init(address="local", include_dashboard=False)
    try:  # from here on, Ctrl-C (even during start-up) shuts Serve down
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name="rayseq-chat", route_prefix="/")
        print(f"serving {args.checkpoint} at http://{args.host}:{args.port}/  (chat page /, API docs /docs); "
              "Ctrl-C stops", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
