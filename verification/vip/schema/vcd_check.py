#!/usr/bin/env python3
"""Reads VCD traces written by rnic-vip (rnic_vip_trace_write_vcd) with an independent
reader, pyvcd's tokenizer, and checks what docs/guides/verification.md promises: a 1 ps
timescale; per device, one scope per pipeline stage and per QP with the integers `active`
and `slices`; per stage, the final `slices` and the integral of `active` over time equal
the timing model's totals in the `rnicStageTotals` comment; every `active` ends at 0. It
also shows the check can fail: a stage total changed by one picosecond must be refused.

    vcd_check.py TRACE.vcd...
"""
import io
import sys

from vcd.reader import TokenKind, tokenize


def read(data: bytes):
    """Timescale, comments, variables by id (scope path, name) and their changes."""
    timescale = None
    comments, scopes, variables, changes = [], [], {}, {}
    time = 0
    for token in tokenize(io.BytesIO(data)):
        kind = token.kind
        if kind is TokenKind.TIMESCALE:
            magnitude = token.data.magnitude
            timescale = (int(getattr(magnitude, "value", magnitude)), token.data.unit.value)
        elif kind is TokenKind.COMMENT:
            comments.append(token.data.strip())
        elif kind is TokenKind.SCOPE:
            scopes.append(token.data.ident)
        elif kind is TokenKind.UPSCOPE:
            scopes.pop()
        elif kind is TokenKind.VAR:
            variables[token.data.id_code] = (".".join(scopes), token.data.reference)
            changes[token.data.id_code] = []
        elif kind is TokenKind.CHANGE_TIME:
            if token.data < time:
                raise ValueError(f"time {token.data} after {time}")
            time = token.data
        elif kind is TokenKind.CHANGE_VECTOR:
            value = token.data.value
            changes[token.data.id_code].append((time, value if isinstance(value, int) else 0))
    return timescale, comments, variables, changes


def check(data: bytes) -> str:
    """None when the file holds what is promised, else what is wrong."""
    timescale, comments, variables, changes = read(data)
    if timescale != (1, "ps"):
        return f"timescale {timescale}: 1 ps expected"
    by_name = {variables[i]: changes[i] for i in variables}
    totals = [c.split() for c in comments if c.startswith("rnicStageTotals")]
    if not totals:
        return "no rnicStageTotals comment"
    for words in totals:
        device = words[1]
        for total in words[2:]:
            stage, figures = total.split("=")
            count, ps = (int(x) for x in figures.split(":"))
            scope = f"{device}.stage_{stage}"
            if (scope, "active") not in by_name or (scope, "slices") not in by_name:
                return f"no variables for {scope}"
            active, slices = by_name[(scope, "active")], by_name[(scope, "slices")]
            integral = sum(v * (t2 - t1) for (t1, v), (t2, _) in zip(active, active[1:]))
            started = slices[-1][1] if slices else 0
            ending = active[-1][1] if active else 0
            if (started, integral, ending) != (count, ps, 0):
                return f"{scope}: {started} slices, {integral} ps, ending at {ending}; the model: {count}, {ps} ps"
    return None


def main() -> int:
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
        problem = check(data)
        if problem:
            print(f"{path}: {problem}", file=sys.stderr)
            return 1
        # The check must be able to fail: one picosecond more on the first stage charged.
        text = data.decode()
        start = text.index("rnicStageTotals")
        line = text[start : text.index("$end", start)]
        charged = next(w for w in line.split()[2:] if not w.endswith("=0:0"))
        stage, figures = charged.split("=")
        count, ps = figures.split(":")
        tampered = text.replace(charged, f"{stage}={count}:{int(ps) + 1}", 1).encode()
        if check(tampered) is None:
            print(f"{path}: a total changed by 1 ps ({stage}) was not refused", file=sys.stderr)
            return 1
        print(f"{path}: read by pyvcd, stage integrals equal the model's totals (and a 1 ps change is refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
