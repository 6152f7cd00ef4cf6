"""``python -m tpu_interactive.conformance``: the conformance command (tpu_interactive/testing/cli.py).

    python -m tpu_interactive.conformance --report [--ops add,mul] [--dtypes float32,int64]
           [--json conformance_report.json] [--subset ci|full] [--grad] [--max-samples 5]
    python -m tpu_interactive.conformance --errors [--ops ...]     # error_inputs / out= misuse
"""
import sys

from tpu_interactive.testing.cli import main

if __name__ == "__main__":
    sys.exit(main())
