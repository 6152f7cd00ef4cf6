"""Test tooling: differential conformance of the `tpu` device against PyTorch's OpInfo suite.

``conformance`` runs samples on CPU and tpu and compares them (``compare``: moving samples,
tolerances), ``conformance_errors`` checks PyTorch's error promises, ``tables`` holds the op tables
and ``cli`` the ``python -m tpu_interactive.conformance`` command. Imports the backend only.
"""
