#!/usr/bin/env python3
"""Exit 0 when two checkpoints hold byte-identical tensors (names, dtypes, shapes, bytes) in
model.safetensors and optimizer.safetensors; the metadata (which names the run) is not compared.
usage: same_tensors.py CHECKPOINT_A CHECKPOINT_B"""
import json
import os
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def main():
    a, b = sys.argv[1:3]
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = tensors(os.path.join(a, name)), tensors(os.path.join(b, name))
        if ta.keys() != tb.keys():
            print(f"{name}: different tensor names")
            return 1
        differ = [k for k in ta if ta[k] != tb[k]]
        if differ:
            print(f"{name}: {len(differ)} tensors differ, e.g. {differ[0]}")
            return 1
    print(f"identical tensors: {a} == {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
