"""Regenerate every ``tests/migration_cases/*/after.py`` from its ``before.py`` with the tool.

    .venv/bin/python tests/migration_cases/regenerate.py

tests/test_migration.py checks that the committed after.py is exactly what the tool
produces, so run this after changing a case or the tool (and review the diff).
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch_spdl.migration import migrate_source

CASES = Path(__file__).resolve().parent


def main() -> int:
    for before in sorted(CASES.glob("*/before.py")):
        result = migrate_source(before.read_text(), str(before))
        if result.migrated is None:
            print(f"{before}: {result.error}", file=sys.stderr)
            return 1
        after = before.with_name("after.py")
        old = after.read_text() if after.exists() else None
        if old != result.migrated:
            after.write_text(result.migrated)
            print(f"updated {after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
