"""Entry point: ``python -m dbspark.conformance VECTOR.json [--engine ...] [--warehouse DIR]``."""

from dbspark.conformance.cli import main

raise SystemExit(main())
