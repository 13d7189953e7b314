"""tidegate: the daemon (loop, config, database, admin API, CLI) around the pure decision core."""

__version__ = "0.1.0"
