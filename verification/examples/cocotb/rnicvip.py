"""The model's RoCEv2 codec for Python, through librnicvip's C ABI with ctypes
(rnic_vip_frame_encode / rnic_vip_frame_decode; include/rnicvip.h). The library is the one
cargo built: $RNICVIP_LIB, or target/debug/librnicvip.so of this checkout."""

import ctypes
import os
from pathlib import Path

RNIC_VIP_OK = 0
RNIC_VIP_E_BUFFER = -4
ABI_MAJOR = 1


def _library() -> ctypes.CDLL:
    default = Path(__file__).resolve().parents[3] / "target" / "debug" / "librnicvip.so"
    lib = ctypes.CDLL(os.environ.get("RNICVIP_LIB", str(default)))
    lib.rnic_vip_abi_version.restype = ctypes.c_uint32
    lib.rnic_vip_last_error.restype = ctypes.c_char_p
    lib.rnic_vip_frame_decode.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.rnic_vip_frame_decode.restype = ctypes.c_int32
    lib.rnic_vip_frame_encode.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t)]
    lib.rnic_vip_frame_encode.restype = ctypes.c_int32
    version = lib.rnic_vip_abi_version()
    if version >> 16 != ABI_MAJOR:
        raise RuntimeError(f"librnicvip ABI {version >> 16}.{version & 0xFFFF}: major {ABI_MAJOR} expected")
    return lib


_lib = _library()


class CodecError(Exception):
    """The library refused a frame or a field (its message says why)."""


def _error(what: str, status: int) -> CodecError:
    return CodecError(f"{what}: status {status}: {_lib.rnic_vip_last_error().decode()}")


def encode(fields: dict[str, int], payload: bytes = b"") -> bytes:
    """A valid frame from named fields (defaults for the rest), as the model builds it."""
    text = " ".join(f"{name}={value:#x}" for name, value in fields.items()).encode()
    capacity = 64 + 128 + len(payload)
    out = ctypes.create_string_buffer(capacity)
    length = ctypes.c_size_t(0)
    status = _lib.rnic_vip_frame_encode(text, payload, len(payload), out, capacity, ctypes.byref(length))
    if status != RNIC_VIP_OK:
        raise _error(f"encode {text.decode()}", status)
    return out.raw[: length.value]


def decode(frame: bytes) -> list[tuple[str, int]]:
    """The frame's fields in header order, as the model's receive path reads them."""
    needed = ctypes.c_size_t(0)
    capacity = 1024
    while True:
        out = ctypes.create_string_buffer(capacity)
        status = _lib.rnic_vip_frame_decode(frame, len(frame), out, capacity, ctypes.byref(needed))
        if status == RNIC_VIP_E_BUFFER:
            capacity = needed.value
            continue
        if status != RNIC_VIP_OK:
            raise _error("decode", status)
        break
    fields = []
    for line in out.value.decode().splitlines():
        name, value = line.split("=", 1)
        fields.append((name, int(value, 16)))
    return fields
