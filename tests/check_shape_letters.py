#!/usr/bin/env python3
"""Tensor names end in their shape letters (x_TD, gate_EOI). src/core/shapes.h is the one legend:
this check fails on a suffix letter it does not define, or on a letter it keeps to some folders
([methods/intb]) used in another, where it would take a second meaning. Lowercase letters name a
slice of a dimension (h_tD: a chunk of the T rows), digits literal sizes; all-caps words of five
letters or more (and quiet_NaN) are not shapes."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
legend = root / "src/core/shapes.h"
entries = re.findall(r"^//   ([A-Z][a-z]?) .*?(?:\[([\w/ ]+)\])?$", legend.read_text(), re.M)
scope = {letter: folders.split() for letter, folders in entries}
if len(scope) < 20:
    sys.exit(f"{legend}: found only {len(scope)} legend entries; did its format change?")
name = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)*_([A-Z0-9][A-Za-z0-9]{0,7})\b")
letters = re.compile(r"Dh|[A-Z]|[a-z]|[0-9]+")


def problem(letter, where):
    if letter not in scope:
        return "is not in src/core/shapes.h"
    folders = scope[letter]
    if folders and not any(where == f or where.startswith(f + "/") for f in folders):
        return f"is kept to {' '.join(folders)}"
    return None


bad = []
for top in ("src", "tests"):
    for path in sorted((root / top).rglob("*")):
        if path.suffix not in (".h", ".cpp") or path == legend or {"npm", "fixtures"} & set(path.parts):
            continue
        where = path.parent.relative_to(root / top).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
            for suffix in name.findall(line):
                if (len(suffix) >= 5 and suffix.isupper()) or suffix in ("NaN",):
                    continue
                for letter in letters.findall(suffix):
                    if letter[0].isalpha():  # a lowercase letter: a slice of that dimension
                        if why := problem(letter if letter == "Dh" else letter.upper(), where):
                            bad.append(f"{path.relative_to(root)}:{number}: {suffix}: {letter} {why}")
print("\n".join(bad))
print(f"{len(scope)} letters in the legend; {len(bad)} names break it")
sys.exit(1 if bad else 0)
