#!/usr/bin/env python3
"""Mutation check: apply one-token mutations to the sources, rebuild the named test executable,
run it, and report which mutations the suite caught. The tree is restored after each one.

  scripts/mutate.py                     # every mutation in scripts/mutations.txt
  scripts/mutate.py --only top_p        # those whose name contains "top_p"

mutations.txt: one per line, `name | file | original text | mutated text | test executable`
(the original must occur exactly once in the file). Add a line for every new formula.
Each mutant rebuilds one object and one test executable: about 2-3 minutes on 2 cores.
"""
import argparse, pathlib, subprocess, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "release"


def run(cmd):
    return subprocess.run(cmd, cwd=BUILD, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the mutations whose name contains this")
    ap.add_argument("--list", default=str(ROOT / "scripts" / "mutations.txt"))
    a = ap.parse_args()
    rows = []
    for line in pathlib.Path(a.list).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            rows.append([f.strip() for f in line.split(" | ")])
    survived = 0
    for name, path, original, mutant, target in rows:
        if a.only not in name:
            continue
        f = ROOT / path
        text = f.read_text()
        if text.count(original) != 1:
            print(f"{name}: '{original}' occurs {text.count(original)} times in {path}; fix the list")
            return 2
        try:
            f.write_text(text.replace(original, mutant))
            built = run(["ninja", f"tests/{target}"])
            if built.returncode != 0:
                print(f"{name}: mutant does not compile (not counted)")
                continue
            caught = run([f"tests/{target}"]).returncode != 0
        finally:
            f.write_text(text)
        survived += not caught
        print(f"{name}: {'caught' if caught else 'SURVIVED'}")
    run(["ninja"])  # back to the unmutated build
    print(f"{survived} mutation(s) survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
