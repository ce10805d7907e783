"""`make run`: serve the adapter on 127.0.0.1 with the embedded SmolLM2 model, and show how to call it."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..decisions.model_files import ModelFilesError, embedded_model_dir
from ..settings import Settings, SettingsError
from .serve import PreflightError, run

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "support-route.json"


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
    except (SettingsError, PreflightError, ModelFilesError) as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
