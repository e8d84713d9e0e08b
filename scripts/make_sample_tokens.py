#!/usr/bin/env python3
"""Write data/sample_tokens.bin: the bytes of data/sample.txt as little-endian uint16 token ids.

This is the `tokens` data format (data.kind = "tokens"): a flat array of uint16 ids, the whole file, which is
also the layout of the token files of early llm.c. With --llmc-header the file instead gets llm.c's current
layout: a 1024-byte header of 256 little-endian int32 (magic 20240520, version 1, token count, zeros) followed
by the uint16 ids; proplab reads both.

Usage: python3 scripts/make_sample_tokens.py [--text data/sample.txt] [--out data/sample_tokens.bin] [--llmc-header]
"""
import argparse
import array
import pathlib
import struct
import sys

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=pathlib.Path, default=root / "data" / "sample.txt")
    parser.add_argument("--out", type=pathlib.Path, default=root / "data" / "sample_tokens.bin")
    parser.add_argument("--llmc-header", action="store_true", help="write llm.c's 1024-byte header first")
    args = parser.parse_args()

    data = args.text.read_bytes()
    if not data:
        print(f"error: {args.text} is empty", file=sys.stderr)
        return 1
    tokens = array.array("H", iter(data))  # one uint16 token per byte, ids 0..255 (bytes would be read as pairs)
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(args.out, "wb") as out:
        if args.llmc_header:
            header = [0] * LLMC_HEADER_INTS
            header[0], header[1], header[2] = LLMC_MAGIC, 1, len(tokens)
            out.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        out.write(tokens.tobytes())
    print(f"wrote {args.out}: {len(tokens)} uint16 tokens, max id {max(data)}"
          + (" (llm.c header)" if args.llmc_header else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
