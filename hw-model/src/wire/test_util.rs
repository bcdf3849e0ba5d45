//! Test helpers: a tiny seeded xorshift generator (no external crates) and capture readers.

/// xorshift64* — deterministic, seeded; tests print the seed on failure via their messages.
pub struct XorShift(u64);

impl XorShift {
    /// A generator; seed 0 is replaced by a fixed non-zero constant.
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 { 0x9E37_79B9_7F4A_7C15 } else { seed })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    pub fn u16(&mut self) -> u16 {
        (self.next_u64() >> 48) as u16
    }

    pub fn u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    pub fn bool(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for b in &mut out {
            *b = self.u8();
        }
        out
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.u8();
        }
    }
}

/// Frames of a classic pcap file (little-endian, microsecond magic).
pub fn pcap_frames(file: &[u8]) -> Vec<&[u8]> {
    assert_eq!(&file[..4], &[0xd4, 0xc3, 0xb2, 0xa1], "not a little-endian pcap");
    let mut frames = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let caplen = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap()) as usize;
        frames.push(&file[at + 16..at + 16 + caplen]);
        at += 16 + caplen;
    }
    frames
}

/// Packet data of the Enhanced Packet Blocks of a little-endian pcapng file.
pub fn pcapng_frames(file: &[u8]) -> Vec<&[u8]> {
    assert_eq!(&file[..4], &[0x0a, 0x0d, 0x0d, 0x0a], "not a pcapng");
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 12 <= file.len() {
        let block_type = u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
        let block_len = u32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
        if block_type == 6 {
            let caplen = u32::from_le_bytes(file[at + 20..at + 24].try_into().unwrap()) as usize;
            frames.push(&file[at + 28..at + 28 + caplen]);
        }
        at += block_len;
    }
    frames
}
