"""The Flask application: SageMaker's /ping and /invocations over the decision model.

``create_app(settings=None, engine=None)`` builds it. Without an engine the model loads in a
background thread, so that /ping can answer 503 while it loads; with an injected engine (tests) it
loads before ``create_app`` returns. This layer never imports llama.cpp.
"""

from __future__ import annotations

import gzip
import hmac
import json
import logging
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

import zstandard

from . import decision_schema, systemone
from .admission import Admission
from .errors import ApiError, InputError, busy
from .logs import log_request
from .scheduler import Busy, DeadlineExceeded, ScoringFailed
from .settings import Settings
from .startup import Readiness, load_into

log = logging.getLogger(__name__)

JSON_TYPES = {"application/json"}
JSONLINES_TYPES = {"application/jsonlines", "application/x-jsonlines", "application/jsonl", "application/x-ndjson"}
SCORING_ENDPOINTS = {"invocations", "systemone_route"}
NEEDS_MODEL = SCORING_ENDPOINTS | {"models_route"}


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
    state = AdapterState(settings, Readiness(), Admission(settings.queue_depth), engine)
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
        g.protocol = "systemone" if request.path.startswith("/v1/") else "sagemaker"
        if g.protocol == "systemone":
            _authenticate(settings.api_key)
        if request.endpoint not in NEEDS_MODEL:
            return
        if state.readiness.state != "ready":
            raise ApiError(503, f"model is not ready: {state.readiness.reason}",
                           headers={"Retry-After": str(settings.retry_after_s)},
                           body={"error": f"model is not ready: {state.readiness.reason}", "retryable": True})
        if request.endpoint not in SCORING_ENDPOINTS:
            return
        if not state.admission.try_enter():
            raise busy(settings.retry_after_s, "the server is shutting down" if state.admission.draining else None)
        g.admitted = True

    @app.teardown_request
    def leave(_exc: BaseException | None) -> None:
        if g.get("admitted"):
            state.admission.leave()
            g.admitted = False

    @app.after_request
    def log_it(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.get("request_id", "")
        if g.get("protocol") == "systemone":
            response.headers["x-typesafe-request-id"] = g.get("request_id", "")
        if request.endpoint != "ping":
            log_request({"request_id": g.get("request_id"), "method": request.method, "path": request.path,
                         "status": response.status_code,
                         "total_s": round(time.perf_counter() - g.get("started", time.perf_counter()), 6),
                         **g.get("log", {})})
        return response

    @app.errorhandler(ApiError)
    def api_error(exc: ApiError):
        if g.get("protocol") == "systemone":
            return _json({**systemone.error_body(exc.status, exc.message),
                          **{k: v for k, v in exc.body.items() if k == "retryable"}}, exc.status, exc.headers)
        return _json(exc.body, exc.status, exc.headers)

    @app.errorhandler(InputError)
    def input_error(exc: InputError):
        if g.get("protocol") == "systemone":
            return _json(systemone.validation_error(exc), 422)
        return _json({"error": str(exc)}, 400)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        return api_error(ApiError(exc.code or 500, exc.description or exc.name))

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        log.exception("unhandled error", extra={"fields": {"request_id": g.get("request_id")}})
        return api_error(ApiError(500, "internal error"))

    @app.get("/ping")
    def ping():
        readiness = state.readiness
        if state.admission.draining:
            return _json({"status": "draining", "detail": "the server is shutting down"}, 503)
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

    @app.post("/v1/systemone")
    def systemone_route():
        if request.mimetype and request.mimetype.lower() not in JSON_TYPES:
            raise ApiError(415, f"Content-Type must be application/json (got {request.content_type})")
        payload, status = _systemone(_parse_json(_read_body(settings.max_body_bytes)), state.readiness.model, state)
        return _json(payload, status)

    @app.get("/v1/models")
    def models_route():
        model = state.readiness.model
        released = (model.identity.built_at or "")[:10] or time.strftime(
            "%Y-%m-%d", time.gmtime(_mtime(settings.model_dir, model.identity.file)))
        described = f"{model.identity.file} ({model.model_info.get('architecture', 'gguf')}), served by llama.cpp"
        return _json({"models": [
            {"name": model.served_id, "description": f"Decision model {described}.", "release_date": released},
            {"name": systemone.ALIAS, "description": f"Alias of {model.served_id}.", "release_date": released}]})

    return app


def _authenticate(api_key: str) -> None:
    """Bearer auth on /v1/*: the header is always accepted; a key is required only when one is set."""
    if not api_key:
        return
    scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Missing API key: send Authorization: Bearer <key>",
                       headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "Invalid API key", headers={"WWW-Authenticate": "Bearer"})


def _mtime(model_dir: str, name: str) -> float:
    import os

    try:
        return os.path.getmtime(os.path.join(model_dir, name))
    except OSError:
        return time.time()


def _systemone(obj: Any, model, state: AdapterState) -> tuple[dict[str, Any], int]:
    """Answer one System One body; invalid ones get FastAPI's 422 shape, naming the field."""
    g.protocol = "systemone"
    try:
        _, _, items = systemone.parse(obj, model.served_id, state.settings.max_decisions)
        prepared = model.prepare([item.question for item in items])
    except InputError as exc:
        return systemone.validation_error(exc), 422
    scored, stats, queue_s = _score(model, prepared, state)
    input_tokens = sum(s.input_tokens for s in scored)
    g.log.update({"questions": len(items), "input_tokens": input_tokens, "queue_s": round(queue_s, 6),
                  "prefill_s": round(stats.prefill_s, 6), "readout_s": round(stats.readout_s, 6)})
    return {
        "model": model.served_id,
        "answers": {item.qid: systemone.answer(item, s) for item, s in zip(items, scored)},
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        "x_evaluated_tokens": stats.shared_tokens + sum(stats.own_tokens),
        "x_cached_tokens": stats.cached_tokens,
        "x_timing": {"queue": queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
                     "total": time.perf_counter() - g.started},
    }, 200


def _dispatch(obj: Any, model, state: AdapterState) -> tuple[dict[str, Any], int]:
    """Answer one request object (a JSON body or one JSON-lines line)."""
    settings = state.settings
    if isinstance(obj, dict) and "questions" in obj:
        return _systemone(obj, model, state)
    if not isinstance(obj, dict):
        raise InputError((), "the body must be a JSON object")
    if "decision" in obj:
        decisions = [decision_schema.parse_one(obj, model.max_options)]
    elif "decisions" in obj:
        decisions = decision_schema.parse_many(obj, settings.max_decisions, model.max_options)
    else:
        raise InputError((), "the body must hold 'decision', 'decisions' or 'questions' (System One)")
    prepared = model.prepare([d.question for d in decisions])
    scored, stats, queue_s = _score(model, prepared, state)
    results = [decision_schema.result(d, s, model.model_info) for d, s in zip(decisions, scored)]
    timing = {"queue": queue_s, "prefill": stats.prefill_s, "readout": stats.readout_s,
              "total": time.perf_counter() - g.started, "cached_tokens": stats.cached_tokens}
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
    """Queue the request for the model and wait for it: 503 when the queue is full or the deadline passes."""
    try:
        ticket = model.submit(prepared, state.settings.request_timeout_s)
        scored, stats = model.result(prepared, ticket)
    except (Busy, DeadlineExceeded):
        raise busy(state.settings.retry_after_s) from None
    except ScoringFailed as exc:
        log.error("scoring failed", extra={"fields": {"request_id": g.get("request_id"), "cause": str(exc)}})
        raise ApiError(500, "scoring failed") from None
    return scored, stats, ticket.queue_s


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
            g.protocol = "sagemaker"
            payload, status = handle(_parse_json(line.encode("utf-8")))
            if status != 200:
                payload = {**payload, "status": status}
        except InputError as exc:
            payload = {"error": f"line {number}: {exc}", "status": 400}
        except ApiError as exc:
            payload = {**exc.body, "error": f"line {number}: {exc.message}", "status": exc.status}
            if g.get("protocol") == "systemone":
                payload = {**systemone.error_body(exc.status, exc.message), "status": exc.status}
        out.append(json.dumps(payload, ensure_ascii=False))
    return Response("\n".join(out) + "\n", 200, mimetype="application/jsonlines")


def _read_body(limit: int) -> bytes:
    """The request body, decoded per Content-Encoding; over ``limit`` bytes, sent or decoded, is a 413."""
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, f"the body has {length} bytes, over the limit of {limit}")
    data = request.stream.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, f"the body is over the limit of {limit} bytes")
    encoding = (request.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding == "identity":
        return data
    try:
        if encoding == "zstd":
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                decoded = reader.read(limit + 1)
        elif encoding in ("gzip", "x-gzip"):
            decoded = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, limit + 1)
        else:
            raise ApiError(415, f"Content-Encoding {encoding!r} is not supported (use zstd, gzip or identity)")
    except (zstandard.ZstdError, zlib.error, gzip.BadGzipFile) as exc:
        raise ApiError(400, f"the body is not valid {encoding} data: {exc}") from None
    if len(decoded) > limit:
        raise ApiError(413, f"the decoded body is over the limit of {limit} bytes")
    return decoded


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError((), f"the body is not valid JSON: {exc}", "json_invalid") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False), status, headers=headers, mimetype="application/json")
