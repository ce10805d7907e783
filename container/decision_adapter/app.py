"""The Flask application: SageMaker's /ping and /invocations over the decision model.

``create_app(settings=None, engine=None)`` builds it. Without an engine the model loads in a
background thread, so that /ping can answer 503 while it loads; with an injected engine (tests) it
loads before ``create_app`` returns. This layer never imports llama.cpp.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from . import decision_schema
from .admission import Admission
from .errors import ApiError, InputError, busy
from .logs import log_request
from .settings import Settings
from .startup import Readiness, load_into

log = logging.getLogger(__name__)

JSON_TYPES = {"application/json"}
JSONLINES_TYPES = {"application/jsonlines", "application/x-jsonlines", "application/jsonl", "application/x-ndjson"}
SCORING_ENDPOINTS = {"invocations"}


@dataclass
class AdapterState:
    settings: Settings
    readiness: Readiness
    admission: Admission
    engine: Any = None
    loader: threading.Thread | None = field(default=None, repr=False)

    def start_loading(self) -> None:
        """Load in the background (once); /ping stays 503 until the model is ready."""
        if self.loader is None:
            self.loader = threading.Thread(target=load_into, args=(self.readiness, self.settings, self.engine),
                                           name="model-loader", daemon=True)
            self.loader.start()


def create_app(settings: Settings | None = None, engine: Any = None, *, defer_loading: bool = False) -> Flask:
    settings = settings or Settings.from_env()
    app = Flask(__name__)
    app.json.sort_keys = False
    state = AdapterState(settings, Readiness(), Admission(settings.queue_depth, settings.queue_timeout_s), engine)
    app.extensions["decision_adapter"] = state
    if engine is not None and not defer_loading:
        load_into(state.readiness, settings, engine)
    elif not defer_loading:
        state.start_loading()

    @app.before_request
    def admit() -> None:
        g.started = time.perf_counter()
        g.request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        g.log = {}
        g.admitted = False
        if request.endpoint not in SCORING_ENDPOINTS:
            return
        if state.readiness.state != "ready":
            raise ApiError(503, f"model is not ready: {state.readiness.reason}",
                           headers={"Retry-After": str(settings.retry_after_s)},
                           body={"error": f"model is not ready: {state.readiness.reason}", "retryable": True})
        if not state.admission.try_enter():
            raise busy(settings.retry_after_s)
        g.admitted = True

    @app.teardown_request
    def leave(_exc: BaseException | None) -> None:
        if g.get("admitted"):
            state.admission.leave()
            g.admitted = False

    @app.after_request
    def log_it(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.get("request_id", "")
        if request.endpoint != "ping":
            log_request({"request_id": g.get("request_id"), "method": request.method, "path": request.path,
                         "status": response.status_code,
                         "total_s": round(time.perf_counter() - g.get("started", time.perf_counter()), 6),
                         **g.get("log", {})})
        return response

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError):
        return _json(exc.body, exc.status, exc.headers)

    @app.errorhandler(InputError)
    def input_error(exc: InputError):
        return _json({"error": str(exc)}, 400)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        return _json({"error": exc.description}, exc.code or 500)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error", extra={"fields": {"request_id": g.get("request_id")}})
        return _json({"error": "internal error"}, 500)

    @app.get("/ping")
    def ping():
        readiness = state.readiness
        status = 200 if readiness.state == "ready" else 503
        return _json({"status": readiness.state, "detail": readiness.reason,
                      "admitted": state.admission.admitted, "capacity": state.admission.capacity}, status)

    @app.post("/invocations")
    def invocations():
        content_type = (request.mimetype or "").lower()
        if content_type not in JSON_TYPES | JSONLINES_TYPES:
            raise ApiError(415, "Content-Type must be application/json or application/jsonlines "
                                f"(got {request.content_type or 'none'})")
        body = _read_body(settings.max_body_bytes)
        model = state.readiness.model
        if content_type in JSONLINES_TYPES:
            return _jsonlines(body, lambda obj: _dispatch(obj, model, state), settings.max_lines)
        payload, status = _dispatch(_parse_json(body), model, state)
        return _json(payload, status)

    return app


def _dispatch(obj: Any, model, state: AdapterState) -> tuple[dict[str, Any], int]:
    """Answer one request object (a JSON body or one JSON-lines line)."""
    settings = state.settings
    if not isinstance(obj, dict):
        raise InputError((), "the body must be a JSON object")
    if "decision" in obj:
        decisions = [decision_schema.parse_one(obj, model.max_options)]
    elif "decisions" in obj:
        decisions = decision_schema.parse_many(obj, settings.max_decisions, model.max_options)
    else:
        raise InputError((), "the body must hold 'decision' or 'decisions'")
    prepared = model.prepare([d.question for d in decisions])
    scored, stats, queue_s = _score(model, prepared, state)
    results = [decision_schema.result(d, s, model.model_info) for d, s in zip(decisions, scored)]
    timing = {"queue": queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
              "total": time.perf_counter() - g.started}
    g.log.update({"decisions": g.log.get("decisions", 0) + len(decisions),
                  "input_tokens": g.log.get("input_tokens", 0) + sum(s.input_tokens for s in scored),
                  "queue_s": round(queue_s, 6), "prefill_s": round(stats.prefill_s, 6),
                  "readout_s": round(stats.readout_s, 6)})
    if "decision" in obj:
        return {"result": {**results[0], "timing": timing}}, 200
    timing.update({"prefix_tokens": stats.resident_tokens + stats.shared_tokens,
                   "resident_tokens": stats.resident_tokens, "shared_tokens": stats.shared_tokens,
                   "question_tokens": list(stats.own_tokens)})
    return {"results": results, "timing": timing}, 200


def _score(model, prepared, state: AdapterState):
    with state.admission.model_turn() as waited:
        if waited is None:
            raise busy(state.settings.retry_after_s)
        try:
            scored, stats = model.score(prepared)
        except Exception:
            log.exception("scoring failed", extra={"fields": {"request_id": g.get("request_id")}})
            raise ApiError(500, "scoring failed") from None
    return scored, stats, waited


def _jsonlines(body: bytes, handle: Callable[[Any], tuple[dict[str, Any], int]], max_lines: int) -> Response:
    """One result line per input line, in order; a bad line gets an error object without failing the rest."""
    lines = body.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1].strip() == "":
        lines.pop()
    if not lines:
        raise ApiError(400, "the JSON-lines body has no lines")
    if len(lines) > max_lines:
        raise ApiError(400, f"the JSON-lines body has {len(lines)} lines, over the limit of {max_lines}")
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            if not line.strip():
                raise InputError((), "is empty")
            payload, _ = handle(_parse_json(line.encode("utf-8")))
        except InputError as exc:
            payload = {"error": f"line {number}: {exc}", "status": 400}
        except ApiError as exc:
            payload = {**exc.body, "error": f"line {number}: {exc.message}", "status": exc.status}
        out.append(json.dumps(payload, ensure_ascii=False))
    return Response("\n".join(out) + "\n", 200, mimetype="application/jsonlines")


def _read_body(limit: int) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, f"the body has {length} bytes, over the limit of {limit}")
    data = request.stream.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, f"the body is over the limit of {limit} bytes")
    return data


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError((), f"the body is not valid JSON: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False), status, headers=headers, mimetype="application/json")
