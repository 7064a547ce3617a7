"""Run by every Python process whose PYTHONPATH starts with this folder (a test's `twostep serve`, and the Ray
workers it starts): the fault TWOSTEP_TEST_POISON names, injected (tests/fault_helpers.py); nothing without it."""

import os

if os.environ.get("TWOSTEP_TEST_POISON"):
    from fault_helpers import from_environment

    from_environment()
