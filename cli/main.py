"""`sangam`: parse the command line, run the subcommand, turn bad input into one line and exit status 2."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from cli import app, fit, live, profile, reproduce, search, serve, sim, sweep, trace, validate
from runs.build import check as check_build

COMMANDS = {
    "sim": sim,
    "live": live,
    "serve": serve,
    "trace": trace,
    "app": app,
    "profile": profile,
    "validate": validate,
    "sweep": sweep,
    "search": search,
    "fit": fit,
    "reproduce": reproduce,
}


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit status 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: the command stops as on Ctrl-C (what finished is kept, process pools are shut down),
    exit status 143."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sangam", description="Serve and simulate cached diffusion LLMs.")
    commands = parser.add_subparsers(dest="command", title="commands", parser_class=Parser)
    for name, module in COMMANDS.items():
        module.add_parser(commands, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # only the main thread may set a handler, and a process that inherited SIGTERM ignored keeps it so
    # (serve sets its own, for its drain)
    handling = threading.current_thread() is threading.main_thread()
    handling = handling and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    before = signal.signal(signal.SIGTERM, _terminate) if handling else None
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        check_build()
        status: int = COMMANDS[args.command].run(args)
        return status
    except (UsageError, ValueError, RuntimeError) as err:
        return _fail(str(err))
    except OSError as err:
        return _fail(describe_os_error(err))
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        print(f"sangam: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if handling:  # None: a handler not set from Python, which only the default stands for here
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def describe_os_error(err: OSError) -> str:
    """`afile: File exists` rather than `[Errno 17] File exists: 'afile'`."""
    if err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror}"
    return err.strerror or str(err)


def _fail(message: str) -> int:
    print(f"sangam: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
