"""Entry point: ``python -m dbspark.sql explain FILE.sql --sources SOURCES.json``."""

from dbspark.sql.cli import main

raise SystemExit(main())
