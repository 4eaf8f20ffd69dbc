"""The Airflow plugin: the status page (FastAPI app + a navigation entry) of the exactly-once pipelines.

Registered through the ``airflow.plugins`` entry point in setup.cfg and listed in provider_info (see there
why both). The page is an external view whose ``href`` points at the app's own route, so the Airflow UI
shows it in its frame, same origin, with the session cookie that the app's routes check (see
:mod:`exactly_once_provider.plugins.app`).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from exactly_once_provider.plugins.app import create_app
from exactly_once_provider.plugins.links import URL_PREFIX

PLUGIN_NAME = "exactly_once"


class ExactlyOncePlugin(AirflowPlugin):
    """Add the "Exactly-once pipelines" page to the Airflow UI."""

    name = PLUGIN_NAME
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Exactly-once pipelines"}]
    external_views = [
        {
            "name": "Exactly-once pipelines",
            # Relative: the UI resolves it against its own base URL, so it works behind a proxy prefix too.
            "href": f"{URL_PREFIX.lstrip('/')}/",
            "url_route": "exactly-once",
            "destination": "nav",
            "category": "browse",
        }
    ]
