"""Serves a GGUF model with llama.cpp's HTTP server (the pinned `xllamacpp`), for the tests of
tests/llamacpp_server.rs and tests/sdk_real_models.rs:

    serve.py MODEL.gguf PORT [--parallel N] [--ctx N] [--threads N] [--no-prefill]
             [--jinja] [--chat-template FILE]

Prints `listening http://127.0.0.1:PORT` once the server answers, then serves until killed.
`--ctx` is the context per slot (`--parallel` slots). `--no-prefill` turns llama.cpp's assistant prefill off: a trailing assistant message is then not
continued, so resumes must not depend on it. `--jinja` renders chat templates with llama.cpp's
Jinja engine, which tools, `tool_choice` and the parsing of calls need (this xllamacpp turns it on
by default; the flag makes sure); `--chat-template FILE` replaces the model's own template with
FILE's (a Jinja template: it implies `--jinja`).
"""

import argparse
import sys
import time
import urllib.request

import xllamacpp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("port", type=int)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--jinja", action="store_true")
    parser.add_argument("--chat-template")
    args = parser.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx * args.parallel
    params.prefill_assistant = not args.no_prefill
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.warmup = False
    if args.jinja or args.chat_template:
        params.use_jinja = True
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as template:
            params.chat_template = template.read()
    server = xllamacpp.Server(params)

    url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"llama.cpp's server did not answer on {url}")
        time.sleep(0.05)
    print(f"listening {url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        del server


if __name__ == "__main__":
    main()
