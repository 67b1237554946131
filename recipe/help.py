"""The text after each command's `--help`: what it does, its exit codes and an example.

One place, so that every command's help has the same three parts (tests/unit/test_help.py
checks each command for them).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_command(
    commands: Any,
    name: str,
    *,
    summary: str,
    description: str,
    exit_codes: dict[int, str],
    examples: list[str],
    usage: str | None = None,
) -> argparse.ArgumentParser:
    """Add subcommand NAME with SUMMARY (the command list), DESCRIPTION, exit codes and examples."""
    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in sorted(exit_codes.items()))
    shown = "\n".join(f"  {example}" for example in examples)
    return commands.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=description,
        usage=usage,
        epilog=f"exit codes:\n{codes}\n\nexample:\n{shown}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
