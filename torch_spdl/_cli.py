"""The ``torch-spdl`` command (also ``python -m torch_spdl``).

``torch-spdl migrate PATH...`` shows, as a unified diff, how the files would move from
torch's DataLoader to torch_spdl (``--write`` applies it), and reports every decision.
Exit status: 0 when every file was migrated or needed nothing, 1 when any file failed
(not Python, does not parse, cannot be read, or refused by `--write`: read-only, not
writable by this user, or owned by someone it cannot be given back to), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-spdl", description="torch_spdl command-line tools."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate = sub.add_parser(
        "migrate",
        help="rewrite torch DataLoader code and split Dataset classes into stages",
        description=(
            "Rewrite torch.utils.data.DataLoader to torch_spdl.DataLoader and split "
            "map-style Dataset classes into load (I/O) and process (CPU) stages where that "
            "is safe. Dry run by default: prints a unified diff on stdout and the report of "
            "every decision on stderr; nothing is written without --write. Exit status: 0 "
            "ok, 1 if any file failed (not Python, does not parse, unreadable, refused by "
            "--write), 2 usage."
        ),
    )
    migrate.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    migrate.add_argument(
        "--write", action="store_true", help="apply the changes to the files in place"
    )
    migrate.add_argument(
        "--no-diff", action="store_true", help="do not print the diff (only the report)"
    )
    migrate.add_argument("--quiet", "-q", action="store_true", help="do not print the text report")
    migrate.add_argument(
        "--report-json",
        metavar="FILE",
        help="also write the report as JSON to FILE ('-': stdout, in place of the diff)",
    )
    return parser


def _migrate(args: argparse.Namespace) -> int:
    from .migration import migrate_paths, render_json, render_text

    results = migrate_paths(args.paths, write=args.write)
    json_to_stdout = args.report_json == "-"
    if not args.no_diff and not args.write and not json_to_stdout:
        for res in results:
            sys.stdout.write(res.diff())
    sys.stdout.flush()  # the diff before the report when both go to a terminal
    if not args.quiet:
        sys.stderr.write(render_text(results))
        if not args.write and any(r.status == "changed" for r in results):
            sys.stderr.write("dry run: nothing written (use --write to apply)\n")
    if args.report_json:
        text = render_json(results)
        if json_to_stdout:
            sys.stdout.write(text)
        else:
            with open(args.report_json, "w", encoding="utf-8") as f:
                f.write(text)
    return 1 if any(r.status == "error" for r in results) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "migrate":
        return _migrate(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
