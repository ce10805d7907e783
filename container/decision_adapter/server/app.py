"""The Flask application: the SageMaker blueprint and the System One blueprint over one decision model.

``create_app(settings=None, engine=None)`` builds it. Without an engine the model loads in a
background thread, so that /ping can answer 503 while it loads; with an injected engine (tests) it
loads before ``create_app`` returns. Each blueprint owns its routes and error shape; the app
adds the request id (in the ``X-Request-Id`` header, the log line and every answer's ``x_request``), the one log
line per request, and the errors routing raises before any blueprint is chosen (404, and 405 with its ``Allow``
header), in the shape of the blueprint the path belongs to.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from flask import Flask, Response, request

from ..metric_logs import COUNT_FIELDS
from ..settings import Settings
from ..startup import Readiness, load_into
from . import sagemaker, systemone
from .admission import Admission
from .calls import release
from .inflight import ARRIVAL, INFERENCE_ID_HEADER, begin, current_request
from .logs import log_request
from .state import EXTENSION, AdapterState


def create_app(settings: Settings | None = None, engine: Any = None, *, defer_loading: bool = False) -> Flask:
    settings = settings or Settings.from_env()
    app = Flask(__name__)
    # OPTIONS is answered like any other method a route lacks: a JSON 405 with Allow, not an empty 200.
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.json.sort_keys = False  # test clients' json= bodies keep their key order, as real clients' do
    state = AdapterState(settings, Readiness(), Admission(settings.queue_depth), engine)
    app.extensions[EXTENSION] = state
    if engine is not None and not defer_loading:
        load_into(state.readiness, settings, engine)
    elif not defer_loading:
        state.start_loading()

    app.register_blueprint(sagemaker.blueprint)
    app.register_blueprint(systemone.blueprint)

    @app.before_request
    def start() -> None:
        """The request begins, before its body is read; its deadline counts from its arrival (``inflight``). Its id
        is the caller's ``X-Request-Id``, else the ``InferenceId`` the caller gave SageMaker's InvokeEndpoint
        (forwarded as ``X-Amzn-SageMaker-Inference-Id``, and what data capture records as ``inferenceId``), else a
        new one; the inference id, when sent, joins the log line and the body's ``x_request`` as well."""
        inference_id = request.headers.get(INFERENCE_ID_HEADER) or None
        in_flight = begin(request.headers.get("X-Request-Id") or inference_id or uuid.uuid4().hex,
                          request.environ.get(ARRIVAL))
        in_flight.inference_id = inference_id

    @app.after_request
    def log_it(response: Response) -> Response:
        in_flight = current_request()
        response.headers["X-Request-Id"] = in_flight.request_id if in_flight else ""
        if request.endpoint != "sagemaker.ping" and in_flight is not None:
            inference = {"inference_id": in_flight.inference_id} if in_flight.inference_id else {}
            log_request({"request_id": in_flight.request_id, **inference, **release(), "method": request.method,
                         "path": request.path,
                         "status": response.status_code, "total_s": round(time.perf_counter() - in_flight.started, 6),
                         **dict.fromkeys(COUNT_FIELDS, 0), **in_flight.log})
        return response

    @app.errorhandler(Exception)
    def unrouted(exc: Exception) -> Response:
        """Errors raised before a blueprint was chosen, in the shape of the blueprint the path belongs to."""
        return _owner(request.path).render_error(exc)

    return app


def _owner(path: str):
    """The blueprint module a path belongs to, for errors raised before routing chose one."""
    return systemone if path == "/v1" or path.startswith("/v1/") else sagemaker
