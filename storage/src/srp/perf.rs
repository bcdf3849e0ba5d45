//! SRP benchmark.
