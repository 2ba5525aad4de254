"""How long the next client waits after a streaming client leaves before its first token.

A client sends a long prompt, streaming, and leaves while the prompt is being read; the next
client's time to first token is measured, against the same request on an idle server.

    PYTHONPATH=app python scripts/server_disconnect.py --target T.gguf [--draft D.gguf] [--words 1200]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

import httpx


def first_token_s(url: str, model: str, content: str) -> float:
    body = {"model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": content}]}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                return time.perf_counter() - start
    raise RuntimeError("no token came")


def leave_early(port: int, model: str, content: str, after_s: float) -> None:
    """A streaming request, the connection closed before its first token."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": content}]})
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        time.sleep(after_s)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--words", type=int, default=1200, help="words in the long prompt (it must fit the context)")
    parser.add_argument("--leave-after", type=float, default=0.5, help="seconds before the client leaves")
    args = parser.parse_args()

    from speculum.engine.loading import load_decoder
    from speculum.engine.settings import LoadOptions
    from speculum.server.api import Serving
    from speculum.server.service import ServedModel

    decoder = load_decoder(args.target, args.draft, LoadOptions(n_ctx=args.ctx))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serving = Serving(ServedModel(decoder, "m", mode="auto"), "127.0.0.1", port)
    serving.start()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        question = "Name three prime numbers."
        idle = []
        for _ in range(3):  # (the first also warms the server up)
            first_token_s(url, "m", "Say hi.")  # the same cache state before each measurement
            idle.append(first_token_s(url, "m", question))
        idle = min(idle[1:])
        first_token_s(url, "m", "Say hi.")
        long_prompt = "Summarise this: " + " ".join(f"word{i % 97}" for i in range(args.words))
        leave_early(port, "m", long_prompt, args.leave_after)
        after = first_token_s(url, "m", question)
    finally:
        serving.stop()
    print(json.dumps({"first_token_s_idle": round(idle, 3), "first_token_s_after_a_client_left": round(after, 3),
                      "ratio": round(after / idle, 2), "leave_after_s": args.leave_after, "words": args.words}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
