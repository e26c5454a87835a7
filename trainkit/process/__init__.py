"""A trainkit command's process: how it starts, takes signals and ends, and the module paths that moved.

``signals`` (SIGTERM and SIGINT routed to the command, never in the middle of an import), ``startup_gc`` (no full
garbage collection through a command's start-up), ``protobuf_backend`` (protobuf's C backend for a command),
``tool_command`` (how ``python -m trainkit.<tool>`` starts and ends) and ``moved_modules`` (the paths modules had
before 0.2, importable until 0.3.0). They act on the interpreter itself -- its signal mask, its collector, its
import system -- not on training, and the package imports them before anything else (``python -m trainkit`` routes
the signals from ``trainkit/__init__.py``), so they stay below every wing and import nothing heavy: this
``__init__`` imports nothing.

Import rule (the layers contract in pyproject.toml, checked by tests/test_layout.py): imports ``trainkit.errors``
only, never ``trainkit.checks``; every other wing may import it.
"""
