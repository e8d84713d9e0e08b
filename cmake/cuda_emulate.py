#!/usr/bin/env python3
"""cuda_emulate.py: turns one kernels/*.cu into host C++ for the CUDA emulation build (PROPLAB_CUDA=EMULATE).

    cuda_emulate.py INPUT.cu OUTPUT.cpp

The output includes kernels/emulation/emu.h first, then the source (with #line directives, so diagnostics name
the .cu file and its lines) in which:
- every launch  name<template args><<<grid, block[, shmem[, stream]]>>>(args)  becomes
  ::proplab::emu::launch("name", grid, block, shmem, stream, [&] { name<template args>(args); })
  (launches may span lines; the line count is kept, so later lines keep their numbers);
- every  __shared__ TYPE NAME[...];  becomes a thread-local static plus a call registering its size (the emulator
  aborts when a block's static shared memory exceeds 48 KiB).
Comments and string literals are left alone. A `<<<` the script cannot parse is an error naming the line.
"""
import re
import sys

SHARED = re.compile(r"__shared__\s+((?:[\w:]+\s+)*?[\w:<>,\s]*?[\w>])\s+(\w+)\s*((?:\[[^\];]*\]\s*)*);")


def code_mask(text):
    """A list of booleans: True where text[i] is code (not inside a comment or a string/char literal)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            mask[k] = False
        i = j
    return mask


def line_of(text, index):
    return text.count("\n", 0, index) + 1


def fail(path, text, index, message):
    sys.exit(f"{path}:{line_of(text, index)}: cuda_emulate: {message}")


def match_forward(text, start, open_char, close_char):
    """Index just past the bracket matching text[start] == open_char (nesting (), [], {})."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def split_top_level(text):
    parts, depth, current = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def kernel_start(path, text, end):
    """Start index of `name<targs>` ending just before `end` (the `<<<`), and the name."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if text[i - 1] == ">":
        depth, j = 0, i - 1
        while j >= 0:
            if text[j] == ">":
                depth += 1
            elif text[j] == "<":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        if j < 0:
            fail(path, text, end, "unbalanced template arguments before <<<")
        i = j
        while i > 0 and text[i - 1].isspace():
            i -= 1
    name_end = i
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:"):
        i -= 1
    if i == name_end:
        fail(path, text, end, "no kernel name before <<<")
    return i, text[i:name_end]


def rewrite_launches(path, text):
    out, pos = [], 0
    mask = code_mask(text)
    search = 0
    while True:
        at = text.find("<<<", search)
        if at < 0:
            break
        if not mask[at]:
            search = at + 3
            continue
        start, name = kernel_start(path, text, at)
        close = text.find(">>>", at + 3)
        if close < 0:
            fail(path, text, at, "<<< without >>>")
        config = split_top_level(text[at + 3 : close])
        if not 2 <= len(config) <= 4:
            fail(path, text, at, f"a launch configuration needs 2 to 4 values, found {len(config)}")
        while len(config) < 4:
            config.append("0" if len(config) == 2 else "nullptr")
        paren = close + 3
        while paren < len(text) and text[paren].isspace():
            paren += 1
        if paren >= len(text) or text[paren] != "(":
            fail(path, text, close, "no argument list after >>>")
        args_end = match_forward(text, paren, "(", ")")
        if args_end < 0:
            fail(path, text, paren, "unbalanced kernel arguments")
        callee = text[start:at].strip()
        args = text[paren + 1 : args_end - 1]
        original = text[start:args_end]
        replacement = (
            f'::proplab::emu::launch("{name}", {config[0]}, {config[1]}, {config[2]}, {config[3]}, '
            f"[&] {{ {callee}({args}); }})"
        )
        missing = original.count("\n") - replacement.count("\n")
        if missing > 0:  # keep the line numbers of everything after the launch
            replacement = replacement[:-2] + "\n" * missing + replacement[-2:]
        out.append(text[pos:start])
        out.append(replacement)
        pos = args_end
        search = args_end
    out.append(text[pos:])
    return "".join(out)


def rewrite_shared(text):
    mask = code_mask(text)

    def replace(match):
        if not mask[match.start()]:
            return match.group(0)
        type_, name, extents = match.group(1).strip(), match.group(2), match.group(3).strip()
        return (
            f"static thread_local {type_} {name}{extents}; "
            f'::proplab::emu::note_shared(&{name}, sizeof({name}), "{name}");'
        )

    return SHARED.sub(replace, text)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cuda_emulate.py INPUT.cu OUTPUT.cpp")
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    body = rewrite_shared(rewrite_launches(source, text))
    header = (
        f"// Generated by cmake/cuda_emulate.py from {source}: do not edit.\n"
        '#include "kernels/emulation/emu.h"\n'
        f'#line 1 "{source}"\n'
    )
    with open(target, "w", encoding="utf-8") as f:
        f.write(header + body)


if __name__ == "__main__":
    main()
