#!/usr/bin/env python3
"""The unity build compiles neighbouring sources as one file (docs/architecture.md, "Build"), so
two files' anonymous-namespace helpers with one name can collide whenever a batch shifts. This
check keeps every such top-level name (type, alias, function, constant) unique across src/."""
import collections
import pathlib
import re
import sys

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent / "src")
block = re.compile(r"namespace \{\n(.*?)\n\}  // namespace\n", re.S)
patterns = [
    re.compile(r"(?:struct|class|enum class|enum)\s+(\w+)"),
    re.compile(r"using\s+(\w+)\s*="),
    re.compile(r"(?:template\s*<.*>\s*)?(?:static\s+|inline\s+|constexpr\s+|const\s+)*[\w:<>,*&\s]+?[\s*&](\w+)\s*\("),
    re.compile(r"(?:static\s+|constexpr\s+|const\s+|inline\s+)+[\w:<>,*&\s]+?[\s*&](\w+)\s*(?:=|\{|\[)"),
]
names = collections.defaultdict(set)
for path in sorted(src.rglob("*.cpp")):
    for body in block.findall(path.read_text()):
        for line in body.split("\n"):
            if not line or line[0] in " /#}" or line.startswith("using namespace"):
                continue
            for p in patterns:
                m = p.match(line)
                if m and m.group(1) not in ("if", "for", "while", "return", "operator"):
                    names[m.group(1)].add(str(path.relative_to(src)))
                    break
clashes = {n: sorted(f) for n, f in names.items() if len(f) > 1}
for n, files in sorted(clashes.items()):
    print(f"unity build: '{n}' is defined in the anonymous namespaces of {', '.join(files)}: give each a name of its own")
if not clashes:
    print(f"unity build: the anonymous-namespace names of {len(names)} helpers are unique")
sys.exit(1 if clashes else 0)
