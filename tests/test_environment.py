"""The installed environment is the one the project pins, and bin/setup guards it.

These tests fail early and clearly when the pinned stack drifts (a pyspark whose Python
files no longer match its JVM jars, a different Airflow) or when bin/setup's Java check
stops rejecting a JVM that Spark 4 cannot run on.
"""

from __future__ import annotations

import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "bin" / "setup"


def test_pyspark_version_matches_its_spark_core_jar() -> None:
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    assert len(jars) == 1, f"expected exactly one spark-core jar, found {jars}"
    m = re.fullmatch(r"spark-core_[0-9.]+-(.+)\.jar", jars[0].name)
    assert m, jars[0].name
    assert pyspark.__version__ == m.group(1)


def test_pyspark_and_pyspark_client_are_the_same_version() -> None:
    # The Airflow Spark provider pulls pyspark-client, which overwrites pyspark's files.
    assert metadata.version("pyspark") == metadata.version("pyspark-client")


@pytest.mark.parametrize(
    ("dist", "version"),
    [
        ("apache-airflow", "3.3.2"),
        ("apache-airflow-providers-apache-spark", "6.3.4"),
        ("pyspark", "4.2.0"),
    ],
)
def test_pinned_distribution_versions(dist: str, version: str) -> None:
    assert metadata.version(dist) == version


def _fake_java(tmp_path: Path, version_line: str) -> Path:
    java = tmp_path / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return java


def _run_setup_check(java: Path | str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DBSPARK_JAVA": str(java)}
    return subprocess.run(
        ["bash", str(SETUP), "--check-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "version_line",
    ['openjdk version "11.0.2" 2019-01-15', 'java version "1.8.0_292"'],
)
def test_setup_rejects_old_java(tmp_path: Path, version_line: str) -> None:
    result = _run_setup_check(_fake_java(tmp_path, version_line))
    assert result.returncode != 0
    assert "Java 17" in result.stderr
    assert "openjdk-17-jre-headless" in result.stderr


def test_setup_rejects_missing_java(tmp_path: Path) -> None:
    result = _run_setup_check(tmp_path / "no-such-java")
    assert result.returncode != 0
    assert "Java 17" in result.stderr
    assert "not found" in result.stderr


@pytest.mark.parametrize(
    "version_line",
    ['openjdk version "17.0.15" 2025-04-15', 'openjdk version "21" 2023-09-19'],
)
def test_setup_accepts_java_17_and_newer(tmp_path: Path, version_line: str) -> None:
    result = _run_setup_check(_fake_java(tmp_path, version_line))
    assert result.returncode == 0, result.stderr
