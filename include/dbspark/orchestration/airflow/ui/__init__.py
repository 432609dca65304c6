"""The dbspark page of the Airflow UI: what the catalog knows, for people.

``status`` reads the catalog into what the page shows (epochs, loops, traces, links
into the Airflow UI), ``render`` turns it into HTML with inline SVG plots, ``app`` is the
FastAPI app (routes, Airflow's authentication), ``plugin`` the Airflow plugin that mounts
it and adds the nav entry. Only ``app`` and ``plugin`` import Airflow, and only the
api-server builds the app.
"""
