"""Source connectors: where one source's batch for one data interval comes from.

``base`` holds the interface every connector implements (:class:`SourceConnector`) and
:func:`source_columns` and :func:`source_schema`; ``landing`` the files landed per interval
(:class:`LandingDirectory`); ``sql`` the change-data pull from an operational table
(:class:`SqlTable`).
"""

from dbspark.orchestration.sources.base import SourceConnector, source_columns, source_schema
from dbspark.orchestration.sources.landing import LandingDirectory
from dbspark.orchestration.sources.sql import SqlTable, sqlalchemy_url

__all__ = [
    "LandingDirectory",
    "SourceConnector",
    "SqlTable",
    "source_columns",
    "source_schema",
    "sqlalchemy_url",
]
