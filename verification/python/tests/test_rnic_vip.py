"""Tests of the rnic_vip Python module (the wheel maturin builds from verification/python).

Run by verification/run-examples after installing the wheel into a virtual environment:
    python verification/python/tests/test_rnic_vip.py
Plain unittest, so no test runner has to be installed; pytest collects it as well.
"""

import json
import os
import tempfile
import unittest

import rnic_vip

BACKDOOR = 0x1000_0000
CONFIG = 'mac = "02:00:00:00:00:01"\nmemory = [{ base = 0x10000000, size = 0x100000 }]'


def session() -> rnic_vip.Session:
    return rnic_vip.Session(CONFIG)


def enable(s: rnic_vip.Session) -> None:
    """PCI command: memory space and bus master; MSI-X enable."""
    s.config_write(0x04, bytes([0x06, 0x00]))
    s.config_write(0x82, (0x8000).to_bytes(2, "little"))


def query_firmware_version(s: rnic_vip.Session, ring: int) -> int:
    """QUERY_FW_VER through the command queue at `ring`, in one batch of transactions."""
    descriptor = bytes(rnic_vip.layout_size("Descriptor"))
    descriptor = rnic_vip.field_set(descriptor, "Descriptor", "OPCODE", 0x0001)
    descriptor = rnic_vip.field_set(descriptor, "Descriptor", "FLAG", 0x9)
    results = s.transact([
        ("mem_write", ring, descriptor),
        ("bar_write32", 0, 0x7000, ring & 0xFFFF_FFFF),
        ("bar_write32", 0, 0x7004, ring >> 32),
        ("bar_write32", 0, 0x7008, 1),
        ("bar_write32", 0, 0x7014, 0),
        ("bar_write32", 0, 0x7010, 1),
        ("run_until_idle", 1_000_000_000),
        ("mem_read", ring, len(descriptor)),
    ])
    assert results[:6] == [None] * 6, results
    reached, done = results[6], results[7]
    assert reached > 0, "virtual time moved"
    assert rnic_vip.field_get(done, "Descriptor", "RETVAL") == 0
    return int.from_bytes(done[8:12], "little")


class SessionTest(unittest.TestCase):
    def test_a_bad_configuration_is_an_exception_naming_the_key(self):
        with self.assertRaises(rnic_vip.VipError) as caught:
            rnic_vip.Session("nope = 1")
        self.assertIn("nope", str(caught.exception))

    def test_configuration_space_and_the_id_register(self):
        s = session()
        self.assertEqual(s.config_read(0, 4)[0], 0x34, "vendor ID low byte")
        self.assertEqual(s.bar_read32(0, 0), 0xFFFF_FFFF, "memory decoding is off until enabled")
        enable(s)
        self.assertNotEqual(s.bar_read32(0, 0), 0xFFFF_FFFF)
        with self.assertRaises(rnic_vip.VipError):
            s.bar_write(0, 0x13000, b"abc")  # 3 bytes: not a PCIe access size
        with self.assertRaises(rnic_vip.VipError):
            s.config_read(4095, 4)  # past configuration space

    def test_a_command_through_the_command_queue_in_one_batch(self):
        s = session()
        enable(s)
        self.assertEqual(query_firmware_version(s, BACKDOOR), 0x0001_0000)
        self.assertGreater(s.now(), 0)

    def test_a_failing_batch_names_the_operation_and_keeps_what_came_before(self):
        s = session()
        with self.assertRaises(rnic_vip.VipError) as caught:
            s.transact([("mem_write", BACKDOOR, b"\x11\x22"), ("mem_read", 0x9000_0000, 8)])
        self.assertIn("operation 1", str(caught.exception))
        self.assertEqual(s.mem_read(BACKDOOR, 2), b"\x11\x22")
        with self.assertRaises(rnic_vip.VipError):
            s.transact([("teleport", 1)])
        with self.assertRaises(rnic_vip.VipError):
            s.transact([("bar_read", 0, 0)])  # too few arguments

    def test_backdoor_memory_is_bounded(self):
        s = session()
        s.mem_write(BACKDOOR + 0x1000, bytes(range(16)))
        self.assertEqual(s.mem_read(BACKDOOR + 0x1000, 16), bytes(range(16)))
        with self.assertRaises(rnic_vip.VipError):
            s.mem_read(0x9000_0000, 8)
        with self.assertRaises(rnic_vip.VipError):
            s.mem_read(BACKDOOR, 1 << 40)  # refused, not a 1 TiB allocation

    def test_time_only_moves_forward(self):
        s = session()
        s.advance_to(1_000_000)
        self.assertEqual(s.now(), 1_000_000)
        with self.assertRaises(rnic_vip.VipError):
            s.advance_to(5)
        self.assertIsNone(s.next_event_time())
        self.assertEqual(s.frames(), [])
        self.assertEqual(s.msix(), [])

    def test_contexts_need_their_table(self):
        s = session()
        with self.assertRaises(rnic_vip.VipError):
            s.context_read("QPC", 1, 256)
        with self.assertRaises(rnic_vip.VipError):
            s.context_read(9, 1, 256)

    def test_a_received_frame_is_covered(self):
        s = session()
        enable(s)
        frame = rnic_vip.encode({"bth.opcode": 0x04, "bth.dqpn": 0x42}, b"hello")
        s.frame_receive(frame)
        s.run_until_idle()
        coverage = json.loads(s.coverage_json())
        self.assertEqual(coverage["schema"], "rnic-vip-coverage/1")
        bins = coverage["groups"]["received.opcode_size"]["bins"]
        self.assertEqual({k: v for k, v in bins.items() if v}, {"RC_SEND_ONLY/1-256": 1})
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "coverage.json")
            s.coverage_write(path)
            with open(path) as f:
                self.assertEqual(json.load(f)["schema"], "rnic-vip-coverage/1")
            with self.assertRaises(rnic_vip.VipError):
                s.coverage_write(os.path.join(d, "missing", "coverage.json"))

    def test_the_checker_names_a_frame_the_model_never_sent(self):
        s = session()
        s.check_start()
        dut = rnic_vip.encode({"bth.opcode": 0x04, "bth.dqpn": 0x42})
        mismatch = s.check_frame(0, dut)
        self.assertIsNotNone(mismatch)
        self.assertEqual((mismatch["stream"], mismatch["index"], mismatch["qpn"], mismatch["field"]),
                         ("frame", 0, 0x42, "frame"))
        self.assertIn("field frame: model nothing", mismatch["message"])
        self.assertEqual(len(s.check_finish()), 1)

    def test_the_checker_names_a_dma_write_and_an_msix_the_model_never_made(self):
        s = session()
        with self.assertRaises(rnic_vip.VipError):
            s.check_start(streams=["frame", "telepathy"])
        s.check_start(streams=["dma_write", "msix"])
        with self.assertRaises(rnic_vip.VipError):
            s.check_cqe(0, 1, bytes(32))  # the CQE stream is not checked
        dma = s.check_dma_write(5, BACKDOOR, b"\x01\x02")
        self.assertEqual((dma["stream"], dma["index"]), ("DMA write", 0), dma)
        msix = s.check_msix(7, 2, 0xFEE0_0000, 0x41)
        self.assertEqual((msix["stream"], msix["index"]), ("MSI-X", 0), msix)
        self.assertEqual(len(s.check_finish()), 2)

    def test_a_recording_replays_and_a_changed_one_diverges(self):
        s = session()
        s.record_start()
        enable(s)
        identity = s.bar_read(0, 0, 4)
        query_firmware_version(s, BACKDOOR)
        text = s.recording()
        self.assertEqual(rnic_vip.replay(text), len(text.splitlines()) - 1, "every event after the header")
        lines = text.splitlines()
        recorded = f'{{"event":"read_data","data":"{identity.hex()}"}}'
        self.assertIn(recorded, lines)
        changed = [line.replace(identity.hex(), "deadbeef") if line == recorded else line for line in lines]
        with self.assertRaises(rnic_vip.VipError) as caught:
            rnic_vip.replay("\n".join(changed))
        self.assertIn("first divergence", str(caught.exception))

    def test_a_trace_is_perfetto_json(self):
        s = session()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            with self.assertRaises(rnic_vip.VipError):
                s.trace_write(path)  # not started
            s.trace_start()
            enable(s)
            query_firmware_version(s, BACKDOOR)
            s.trace_write(path, 3, "dut")
            with open(path) as f:
                trace = json.load(f)
        self.assertTrue(trace["traceEvents"])
        self.assertTrue(all(event["pid"] == 3 for event in trace["traceEvents"]))


class CodecTest(unittest.TestCase):
    def test_encode_then_parse_gives_the_fields_back(self):
        frame = rnic_vip.encode(
            {"bth.opcode": 0x0A, "bth.dqpn": 0x11, "bth.psn": 77, "reth.len": 8, "reth.rkey": 0x100}, b"12345678")
        parsed = rnic_vip.parse(frame)
        self.assertEqual(parsed.opcode, "RC_RDMA_WRITE_ONLY")
        self.assertEqual(parsed.payload, b"12345678")
        fields = parsed.fields
        self.assertEqual((fields["bth.opcode"], fields["bth.dqpn"], fields["bth.psn"]), (0x0A, 0x11, 77))
        self.assertEqual((fields["reth.len"], fields["reth.rkey"]), (8, 0x100))
        names = list(rnic_vip.decode(frame))
        self.assertLess(names.index("eth.dst"), names.index("bth.opcode"), "header order")
        self.assertLess(names.index("bth.opcode"), names.index("reth.va"))

    def test_what_the_device_would_drop_is_refused(self):
        frame = bytearray(rnic_vip.encode({"bth.opcode": 0x04}, b"abc"))
        frame[-1] ^= 1  # ICRC
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.decode(bytes(frame))
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.decode(b"\x00" * 10)
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.encode({"bth.nope": 1})

    def test_layouts_by_name(self):
        self.assertEqual(rnic_vip.layout_size("Qpc"), 256)
        qpc = rnic_vip.field_set(bytes(256), "Qpc", "DQPN", 0x123456)
        self.assertEqual(rnic_vip.field_get(qpc, "Qpc", "DQPN"), 0x123456)
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.field_get(qpc, "Qpc", "NOPE")
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.field_set(bytes(4), "Qpc", "DQPN", 1)  # shorter than the layout


def perfect_run(stimulus):
    """What a DUT that does everything right reports: completions, then the data."""
    completions, data = [], []
    for r in stimulus.requests():
        completions.append(dict(qpn=r.qpn, side="requester", wr_id=r.index))
        if r.consumes_receive:
            completions.append(dict(qpn=r.remote_qpn, side="responder", byte_len=r.length, immediate=r.immediate))
        data.append((r.index, r.payload()))
    return completions, data


class StimulusTest(unittest.TestCase):
    QPS = [(0x10, 0x20), (0x11, 0x21), (0x12, 0x22)]

    def test_the_same_seed_gives_the_same_requests(self):
        a = rnic_vip.Stimulus(7, count=50, qps=self.QPS)
        b = rnic_vip.Stimulus(7, count=50, qps=self.QPS)
        c = rnic_vip.Stimulus(8, count=50, qps=self.QPS)
        self.assertEqual(a.to_json(), b.to_json())
        self.assertNotEqual(a.to_json(), c.to_json())
        self.assertEqual(len(a), 50)

    def test_requests_keep_to_their_constraints(self):
        s = rnic_vip.Stimulus(3, count=200, qps=self.QPS, opcodes=["RDMA_WRITE", "SEND"],
                              size_classes=["small", "multi_packet"], mtu=512, max_packets=3)
        for r in s.requests():
            self.assertIn(r.opcode, ("RDMA_WRITE", "SEND"))
            self.assertIn(r.size_class, ("small", "multi_packet"))
            self.assertTrue(1 <= r.length <= 256 or 513 <= r.length <= 1536, r)
            self.assertIn((r.qpn, r.remote_qpn), self.QPS)
            self.assertEqual(len(r.payload()), r.length)
            self.assertLessEqual(r.local_offset + r.length, s.region_size)
        with self.assertRaises(rnic_vip.VipError) as caught:
            rnic_vip.Stimulus(99, mtu=256, size_classes=["one_packet"])
        self.assertIn("seed 99", str(caught.exception))
        with self.assertRaises(rnic_vip.VipError):
            rnic_vip.Stimulus(1, opcodes=["ATOMIC_TELEPORT"])

    def test_a_perfect_run_matches_every_prediction(self):
        s = rnic_vip.Stimulus(11, count=60, qps=self.QPS)
        board = rnic_vip.Scoreboard(s)
        completions, data = perfect_run(s)
        for c in completions:
            board.complete(**c)
        for wr, payload in data:
            board.check_data(wr, payload)
        self.assertEqual(board.finish(), [])
        self.assertEqual(board.matched, len(completions) + len(data))

    def test_a_corrupted_result_is_caught_naming_the_qp_the_request_and_the_seed(self):
        s = rnic_vip.Stimulus(0x5EED, count=40, qps=self.QPS)
        victim = next(r for r in s.requests() if r.qpn == 0x12 and r.length > 4)
        board = rnic_vip.Scoreboard(s)
        completions, data = perfect_run(s)
        for c in completions:
            board.complete(**c)
        caught = []
        for wr, payload in data:
            if wr == victim.index:
                payload = payload[:3] + bytes([payload[3] ^ 0x80]) + payload[4:]
            try:
                board.check_data(wr, payload)
            except rnic_vip.ScoreboardError as e:
                caught.append(str(e))
        self.assertEqual(len(caught), 1, caught)
        self.assertTrue(caught[0].startswith(f"seed {0x5EED}: QP 0x12, WR {victim.index} ({victim.opcode}"), caught[0])
        self.assertIn("byte 3", caught[0])
        self.assertEqual(len(board.finish()), 1)

    def test_a_failed_completion_and_missing_ones_are_caught(self):
        s = rnic_vip.Stimulus(5, count=10)
        board = rnic_vip.Scoreboard(s)
        first = s.requests()[0]
        with self.assertRaises(rnic_vip.ScoreboardError) as caught:
            board.complete(first.qpn, "requester", wr_id=first.index, status=0x5)
        self.assertIn("seed 5", str(caught.exception))
        self.assertIn("WR 0", str(caught.exception))
        with self.assertRaises(rnic_vip.VipError):
            board.complete(first.qpn, "sideways")
        missing = board.finish()
        self.assertTrue(all(m.startswith(("seed 5: QP 0x10, WR ", "seed 5: QP 0x20, WR ")) for m in missing), missing)
        receives = sum(r.consumes_receive for r in s.requests())
        # The failed completion, then 9 send completions, the receives and 10 data checks never came.
        self.assertEqual(len(missing), 1 + 9 + receives + 10, missing)


if __name__ == "__main__":
    unittest.main(verbosity=2)
