"""A SparkSession for graveler's jobs.

Workers must run the project's interpreter (the one running the driver), so
``PYSPARK_PYTHON`` is set to ``sys.executable`` unless the caller chose one.
Nothing here needs Maven (``--packages``): Parquet is written with pyarrow and
objects move through graveler's object stores.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparkConfig:
    """How to build a session; built at the edge (CLI, spark-submit entry, tests)."""

    master: str | None = None  # None: the active session, spark-submit's --master, else local[*]
    app_name: str = "lakefuse"
    shuffle_partitions: int = 8
    ui: bool = False
    extra: tuple[tuple[str, str], ...] = ()


def python_env() -> None:
    """Point Spark's Python workers at this interpreter (unless already chosen)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(config: SparkConfig = SparkConfig()):
    """The active SparkSession, or a new one built from ``config``."""
    python_env()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and config.master is None:
        return active
    b = SparkSession.builder.appName(config.app_name)
    if config.master:
        b = b.master(config.master)  # else spark-submit's --master, or pyspark's default local[*]
    b = (
        b.config("spark.ui.enabled", "true" if config.ui else "false")
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for k, v in config.extra:
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    log.info("spark session %s (master %s)", spark.sparkContext.applicationId, spark.sparkContext.master)
    return spark
