//! RoCEv2 wire formats (being written).
