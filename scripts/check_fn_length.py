#!/usr/bin/env python3
"""Lists Rust functions longer than a limit (default 80 lines), counted from
the `fn` line to its closing brace, in the given directories. Exits 1 when
any is found: the coordinator keeps its functions short enough to read.

    python3 scripts/check_fn_length.py [--max 80] coordinator/src
"""
import argparse
import pathlib
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    in_tests = None
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        # Find the body's opening brace, then its match (strings and
        # comments are rare enough in signatures to skip).
        depth = 0
        opened = False
        j = i
        while j < len(lines):
            code = strip(lines[j])
            for ch in code:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
                elif ch == ";" and not opened and depth == 0:
                    break
            else:
                if opened and depth == 0:
                    break
                j += 1
                continue
            break
        if opened:
            yield m.group(6), i + 1, j - i + 1
        i += 1


def strip(line):
    """The line without string literals, char literals and // comments."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max", type=int, default=80)
    parser.add_argument("dirs", nargs="+")
    args = parser.parse_args()
    long = []
    for d in args.dirs:
        for path in sorted(pathlib.Path(d).rglob("*.rs")):
            if path.name == "tests.rs":
                continue  # a test module of its own
            text = path.read_text()
            # Unit tests are exempt: a test reads top to bottom.
            cut = text.find("#[cfg(test)]")
            limit_line = text[:cut].count("\n") + 1 if cut >= 0 else None
            for name, line, length in functions(path):
                if limit_line is not None and line >= limit_line:
                    continue
                if length > args.max:
                    long.append((length, f"{path}:{line}", name))
    for length, where, name in sorted(long, reverse=True):
        print(f"{where}: fn {name} is {length} lines (at most {args.max})")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
