"""Entry point of the engine process (see worker.py)."""

import sys

from app.engine.worker import main

main(int(sys.argv[1]), sys.argv[2])
