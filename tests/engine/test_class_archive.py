"""The JVM class-data archive (``dbspark.engine.spark.class_archive``): built by bin/setup,
mapped by the JVMs dbspark starts, and out of the way when a user chose otherwise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dbspark.devtools.spark_daemons import DEFAULT_JAVA_OPTIONS
from dbspark.engine.spark import class_archive
from dbspark.engine.spark.session import session_conf


def built_archive() -> Path:
    path = class_archive.archive_path()
    if path is None or not path.is_file():
        reason = f"no JVM class archive at {path} (bin/setup builds it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def test_the_test_sessions_jvm_maps_the_archive(spark) -> None:
    path = built_archive()
    if shutil.which("jcmd") is None:
        pytest.skip("jcmd (the JDK's diagnostic command) is not on PATH")
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    info = subprocess.run(
        ["jcmd", str(pid), "VM.info"], capture_output=True, text=True, timeout=60
    ).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    assert mapped, info[:2000]
    # The JDK's own base archive is about 13 MB; ours adds Spark's classes on top of it.
    assert int(mapped.group(1)) >= path.stat().st_size, (mapped.group(0), path)


def test_every_launch_dbspark_makes_names_the_archive() -> None:
    path = built_archive()
    option = f"-XX:SharedArchiveFile={path}"
    assert option in DEFAULT_JAVA_OPTIONS  # daemons, the Connect server, test sessions
    assert option in class_archive.with_archive("-Dlog4j.configurationFile=file:/x")


def test_a_users_own_sharing_setting_is_left_alone(tmp_path, monkeypatch) -> None:
    archive = tmp_path / "spark.jsa"
    archive.write_bytes(b"not read by this test")
    monkeypatch.setenv(class_archive.ARCHIVE_VARIABLE, str(archive))
    assert class_archive.java_options()[0] == f"-XX:SharedArchiveFile={archive}"
    mine = ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=a")
    for own in mine:
        assert class_archive.with_archive(own) == own
    # A user's own driver options win over dbspark's (log4j and archive alike).
    assert (
        session_conf(conf={"spark.driver.extraJavaOptions": "-Dx=1"})[
            "spark.driver.extraJavaOptions"
        ]
        == "-Dx=1"
    )


def test_off_or_missing_means_no_option(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(class_archive.ARCHIVE_VARIABLE, "off")
    assert class_archive.archive_path() is None
    assert class_archive.java_options() == ()
    assert class_archive.with_archive("-Dx=1") == "-Dx=1"
    monkeypatch.setenv(class_archive.ARCHIVE_VARIABLE, str(tmp_path / "never-built.jsa"))
    assert class_archive.java_options() == ()
