"""`make run`: serve the adapter on 127.0.0.1 with the embedded SmolLM2 model, and show how to call it."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Mapping

from ..decisions.model_files import ModelFilesError, embedded_model_dir
from ..settings import Settings, SettingsError
from .serve import PreflightError, run

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "support-route.json"
# Order averaging for the embedded model when the user sets none: SmolLM2-135M reads the letter's position more
# than the options (the walkthrough's example is answered by the second label at K = 1), and on a model this small
# scoring every cyclic shift costs little. K is capped at the number of options, so this is every shift for up to
# 16 options. docs/benchmarks.md ("A newcomer's first answer") has the figures it is chosen from. The image's and
# SageMaker's default (settings.py) stays 1: a deployed model is chosen and measured by its owner.
EMBEDDED_PERMUTATIONS = 16


def local_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `make run` serves with: the user's, on 127.0.0.1 and PORT, the embedded model unless
    ADAPTER_MODEL_DIR names another, and for the embedded model order averaging unless ADAPTER_PERMUTATIONS is set.
    A variable set to blanks counts as unset, as in ``Settings.from_env``."""
    out = dict(environ)

    def unset(name: str) -> bool:
        return not out.get(name, "").strip()

    if unset("ADAPTER_MODEL_DIR"):
        out["ADAPTER_MODEL_DIR"] = str(embedded_model_dir())
        if unset("ADAPTER_PERMUTATIONS"):
            out["ADAPTER_PERMUTATIONS"] = str(EMBEDDED_PERMUTATIONS)
    out["ADAPTER_HOST"] = "127.0.0.1"
    out["SAGEMAKER_BIND_TO_PORT"] = out.get("PORT", "8080")
    return out


def sample_call(base: str) -> str:
    """The call `make run` suggests, with the example's path as `make run` (in the repository's root) sees it."""
    return (f"curl -s {base}/invocations -H 'Content-Type: application/json' "
            f"-d @{EXAMPLE.relative_to(ROOT).as_posix()}")


def _announce_when_ready(base: str, embedded: bool) -> None:
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
    caveat = ("The embedded 135M model shows the plumbing, not accuracy: it is at chance on most decisions "
              "(README.md says what it can and cannot do).\n" if embedded else "")
    print(f"\nThe adapter is ready at {base}. Try the walkthrough's example decision:\n\n"
          f"  {sample_call(base)}\n\n"
          f"({EXAMPLE.name} holds: {json.dumps(json.loads(body), separators=(',', ':'))[:160]}...)\n"
          f"{caveat}Stop with Ctrl-C.\n", file=sys.stderr, flush=True)


def main() -> int:
    try:
        settings = Settings.from_env(local_environ(os.environ))
        embedded = Path(settings.model_dir) == embedded_model_dir()
        averaged = (f", each decision averaged over up to {settings.permutations} orderings of its options "
                    f"(ADAPTER_PERMUTATIONS)" if settings.permutations > 1 else "")
        print(f"Serving {settings.model_dir} on http://127.0.0.1:{settings.port}{averaged} (loading the model...)",
              file=sys.stderr, flush=True)
        threading.Thread(target=_announce_when_ready, args=(f"http://127.0.0.1:{settings.port}", embedded),
                         daemon=True).start()
        run(settings)
    except (SettingsError, PreflightError, ModelFilesError) as exc:
        print(f"make run: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
