//! The in-process wire between NICs, with a seeded fault plan (being written).
