"""The pure decision core: no I/O, no clock, no provider, database or HTTP library.

An import-linter contract (``pyproject.toml``) and ``tests/unit/test_purity.py`` keep it so.
"""
