"""The cocotb test of bth_parser.v: seeded constrained-random RoCEv2 frames, built by the
model's codec (the rnic_vip Python module, the wheel verification/python builds), go through the parser one byte a
clock; a scoreboard compares the parser's BTH and RETH fields with the model's decode of
the same frame, frame by frame, and reports the first divergence by frame and field.

BTH_PARSER_VARIANT=good: every frame must agree. BTH_PARSER_VARIANT=broken (the parser
built with BROKEN=1): the check must catch it, at the first UC frame that carries a RETH,
on field reth.va (the first RETH field), and say so in its report."""

import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

import rnic_vip

# Opcodes the model sends and receives on RC and UC (IBA 9.2, table 38); atomics and
# READ responses included: the parser must place the BTH whatever follows it.
OPCODES = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
    0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14,
    0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B,
]
UC_WITH_RETH = {0x26, 0x2A, 0x2B}
# Opcodes whose packets carry a payload (SEND, RDMA WRITE, READ response).
WITH_PAYLOAD = set(range(0x00, 0x0C)) | {0x0D, 0x0E, 0x0F, 0x10} | set(range(0x20, 0x2C))
CHECKED = ("bth.", "reth.")
PARSER_FIELDS = {
    "bth.opcode": "opcode", "bth.se": "se", "bth.m": "m", "bth.pad": "pad", "bth.tver": "tver",
    "bth.pkey": "pkey", "bth.fecn": "fecn", "bth.becn": "becn", "bth.dqpn": "dqpn",
    "bth.ackreq": "ackreq", "bth.psn": "psn", "reth.va": "reth_va", "reth.rkey": "reth_rkey",
    "reth.len": "reth_len",
}
FRAMES = int(os.environ.get("BTH_PARSER_FRAMES", "200"))


def stimulus(seed: int) -> list[bytes]:
    """Every opcode at least twice, the rest random; fields within their widths."""
    rng = random.Random(seed)
    opcodes = OPCODES * 2 + [rng.choice(OPCODES) for _ in range(max(0, FRAMES - 2 * len(OPCODES)))]
    rng.shuffle(opcodes)
    frames = []
    for opcode in opcodes:
        fields = {
            "bth.opcode": opcode,
            "bth.se": rng.getrandbits(1),
            "bth.m": rng.getrandbits(1),
            "bth.pkey": rng.getrandbits(16) | 0x8000,
            "bth.fecn": rng.getrandbits(1),
            "bth.becn": rng.getrandbits(1),
            "bth.dqpn": rng.getrandbits(24),
            "bth.ackreq": rng.getrandbits(1),
            "bth.psn": rng.getrandbits(24),
            "reth.va": rng.getrandbits(64),
            "reth.rkey": rng.getrandbits(32),
            "reth.len": rng.getrandbits(32),
            "ip.version": rng.choice((4, 6)),
        }
        if rng.random() < 0.3:
            fields["eth.vlan"] = rng.getrandbits(16) & 0xEFFF
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 40))) if opcode in WITH_PAYLOAD else b""
        frames.append(rnic_vip.encode(fields, payload))
    return frames


def first_divergence(expected: list[list[tuple[str, int]]], actual: list[dict[str, int]]):
    """(frame, field, model value, parser value) of the first difference, or None. Fields
    are compared in the model's header order; a field only one side has is a difference."""
    for index, (model, parser) in enumerate(zip(expected, actual)):
        model = [(name, value) for name, value in model if name.startswith(CHECKED)]
        for name, value in model:
            if parser.get(name) != value:
                return index, name, value, parser.get(name)
        extra = sorted(set(parser) - {name for name, _ in model})
        if extra:
            return index, extra[0], None, parser[extra[0]]
    if len(expected) != len(actual):
        return min(len(expected), len(actual)), "frame count", len(expected), len(actual)
    return None


def describe(divergence) -> str:
    index, field, model, parser = divergence
    show = lambda v: "absent" if v is None else f"{v:#x}"  # noqa: E731
    return f"first divergence: frame {index}, field {field}: model {show(model)}, parser {show(parser)}"


@cocotb.test()
async def parser_agrees_with_the_model_frame_by_frame(dut):
    variant = os.environ.get("BTH_PARSER_VARIANT", "good")
    seed = int(os.environ.get("BTH_PARSER_SEED", "1"))
    frames = stimulus(seed)
    expected = [list(rnic_vip.decode(frame).items()) for frame in frames]
    actual: list[dict[str, int]] = []

    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.in_valid.value = 0
    dut.in_data.value = 0
    dut.in_last.value = 0
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    async def monitor():
        while True:
            await RisingEdge(dut.clk)
            await ReadOnly()
            if dut.out_valid.value == 1:
                assert dut.bad_ethertype.value == 0, f"frame {len(actual)}: the parser refused the EtherType"
                names = [n for n in PARSER_FIELDS if n.startswith("bth.") or dut.has_reth.value == 1]
                actual.append({n: int(getattr(dut, PARSER_FIELDS[n]).value) for n in names})

    cocotb.start_soon(monitor())
    rng = random.Random(seed + 1)
    for frame in frames:
        for position, byte in enumerate(frame):
            await RisingEdge(dut.clk)
            dut.in_valid.value = 1
            dut.in_data.value = byte
            dut.in_last.value = int(position == len(frame) - 1)
        # Idle cycles between frames, sometimes none.
        for _ in range(rng.choice((0, 0, 1, 3))):
            await RisingEdge(dut.clk)
            dut.in_valid.value = 0
            dut.in_last.value = 0
    await RisingEdge(dut.clk)
    dut.in_valid.value = 0
    dut.in_last.value = 0
    for _ in range(4):
        await RisingEdge(dut.clk)

    divergence = first_divergence(expected, actual)
    dut._log.info("%s variant, seed %d: %d frames sent, %d parsed; %s", variant, seed, len(frames), len(actual),
                  describe(divergence) if divergence else "no divergence")
    if variant == "good":
        assert divergence is None, describe(divergence)
        assert len(actual) == len(frames) == max(FRAMES, 2 * len(OPCODES))
    else:
        first_uc_reth = next(i for i, frame in enumerate(expected) if dict(frame)["bth.opcode"] in UC_WITH_RETH)
        assert divergence is not None, "the broken parser was not caught"
        report = describe(divergence)
        assert report.startswith(f"first divergence: frame {first_uc_reth}, field reth.va: "), report
        assert report.endswith("parser absent"), report
        dut._log.info("the broken variant was caught: %s", report)
