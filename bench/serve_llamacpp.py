"""llama.cpp's OpenAI-compatible server (llama-cpp-python's server app) for a small local GGUF model.

    python bench/serve_llamacpp.py MODEL.gguf [--port 8080] [--n-ctx 4096]

Binds 127.0.0.1 only. Why not ``python -m llama_cpp.server``: on some virtual machines the CPU advertises
AMX but executing it faults, and llama.cpp's weight repacking into "extra buffer types" then crashes the
process. The server app has no setting for that model parameter, so this launcher switches it off where every
``Llama`` gets its model parameters (``llama_model_default_params``), then starts the same app.

Needs ``llama-cpp-python[server]``. Used by the real-model run in bench/README.md.
"""

from __future__ import annotations

import argparse
from typing import Any


def _without_extra_buffer_types() -> None:
    import llama_cpp.llama_cpp as bindings

    defaults = bindings.llama_model_default_params

    def params() -> Any:
        value = defaults()
        value.use_extra_bufts = False  # no weight repacking into AMX buffers
        return value

    bindings.llama_model_default_params = params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="path to the GGUF file")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--n-ctx", type=int, default=4096, help="context window in tokens (default 4096)")
    parser.add_argument("--n-threads", type=int, default=None)
    args = parser.parse_args()

    _without_extra_buffer_types()
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    model = ModelSettings(model=args.model, n_ctx=args.n_ctx, n_threads=args.n_threads or 2, verbose=False)
    app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=args.port), model_settings=[model])
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
