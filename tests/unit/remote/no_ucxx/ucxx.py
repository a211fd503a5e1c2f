"""A ucxx that cannot be imported (test_remote_units.py: what the CLI says without ucxx)."""
raise ImportError("ucxx stand-in: not installed")
