"""spark-submit entry of ``lakefuse import``: the same arguments, on spark-submit's master.

    PYSPARK_PYTHON=.venv/bin/python PYSPARK_DRIVER_PYTHON=.venv/bin/python \
        .venv/bin/spark-submit --master local[4] scripts/spark_import.py --help

Workers run the project's interpreter (PYSPARK_PYTHON) with lakefuse installed; no
``--packages`` are needed.
"""

import sys

from lakefuse.cli import submit_main

if __name__ == "__main__":
    sys.exit(submit_main("import", sys.argv[1:]))
