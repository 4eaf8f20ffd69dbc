"""The status page's FastAPI app, mounted by the Airflow API server under :data:`URL_PREFIX`.

Authentication: Airflow mounts plugin apps with ``app.mount()``, which inherits none of the core API's
dependencies, so every route here declares Airflow's own check itself:
``requires_access_view(AccessView.PLUGINS)`` resolves the user from the ``Authorization: Bearer`` header or
the UI's ``_token`` session cookie through the configured auth manager, then asks the auth manager whether
that user may see plugin views. An anonymous browser is sent to the auth manager's login page and comes back
after logging in; an API client without a token gets 401.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response


def _require_viewer() -> Any:
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import requires_access_view

    return Depends(requires_access_view(AccessView.PLUGINS))


def _overview(all_keys: bool = False):
    from exactly_once_provider.plugins.discovery import newest_xcom, serialized_dags
    from exactly_once_provider.plugins.status import read_overview

    return read_overview(serialized_dags(), every_ledger_key=all_keys, newest_xcom=newest_xcom)


def _to_json(overview) -> dict[str, Any]:
    return {
        "read_at": overview.read_at,
        "errors": overview.errors,
        "notes": overview.notes,
        "unresolved": overview.unresolved,
        "pipelines": [
            {
                "name": s.spec.name,
                "state": s.state,
                "lag": s.lag,
                "dag_ids": sorted(s.spec.dag_ids),
                "found_in": sorted(s.spec.found_in),
                "sections": {sec.slug: {"rows": sec.rows, "error": sec.error} for sec in s.sections},
            }
            for s in overview.pipelines
        ],
        "flows": [
            {
                "name": f.name,
                "state": f.state,
                "pipelines": [m.spec.name for m in f.members],
                "sources": f.sources,
                "topics": f.topics,
                "sinks": f.sinks,
                "lag": f.lag,
                "freshness_seconds": f.freshness,
                "rows_per_second": f.throughput,
                "reconciliation": f.reconciliation,
                "position": f.position and {"text": f.position.text, "gtid": f.position.gtid},
                "history": [p.__dict__ for p in f.history],
                "notes": f.notes,
                "tables": f.tables,
                "dead_letters": f.dead_letters,
                "newest_dead_letter": f.newest_letter,
            }
            for f in overview.flows
        ],
        "seconds": overview.seconds,
    }


def create_app() -> FastAPI:
    """Build the app (routes are synchronous: the readers block on Kafka, PostgreSQL and files)."""
    app = FastAPI(title="Exactly-once pipelines", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(HTTPException)
    async def login_first(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
            from airflow.api_fastapi.app import get_auth_manager

            return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.get("/", response_class=HTMLResponse, dependencies=[_require_viewer()])
    def page(pipeline: str | None = None, all_keys: bool = False) -> str:
        """:param all_keys: also list pipelines only the offsets ledger knows (reads every ledger key)."""
        from exactly_once_provider.plugins.page import render_page

        return render_page(_overview(all_keys), only=pipeline)

    @app.get("/api/pipelines", dependencies=[_require_viewer()])
    def pipelines(all_keys: bool = False) -> dict[str, Any]:
        return _to_json(_overview(all_keys))

    return app
